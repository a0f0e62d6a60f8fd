//! The checked, resumable download of one file: into a `.partial` file, resumed with `Range`
//! after a broken connection or an earlier run, checked for size and sha256, renamed into place.

use crate::client::{bad, broken, header, parse_content_range, shown, Answer, Hub, Known, Remote};
use crate::error::HubError;
use crate::hash::Sum;
use llmr_telemetry::error_chain;
use reqwest::header::CONTENT_RANGE;
use reqwest::{Method, StatusCode};
use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::fs::{self, File, OpenOptions};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// Hidden, so store scans skip it.
pub const STAGING_DIR: &str = ".download";
/// Tries per download; each after the first resumes where the previous one stopped.
const ATTEMPTS: u32 = 4;

/// Where downloads into `model_dir` wait until they are checked.
pub fn staging_dir(model_dir: &Path) -> PathBuf {
    model_dir.join(STAGING_DIR)
}

/// Where an interrupted download of `path` (a `/`-separated path in the model directory) into
/// `model_dir` waits to be resumed: `<model_dir>/.download/<path>.partial`.
pub fn partial_path_for(model_dir: &Path, path: &str) -> PathBuf {
    partial_path(&staging_dir(model_dir).join(path))
}

/// `dest` with `.partial` appended to its file name.
pub(crate) fn partial_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(format!("{name}.partial"))
}

/// A failed try at a transfer: worth retrying (the connection dropped) or not.
enum Failure {
    Retry(HubError),
    Fatal(HubError),
}

impl From<HubError> for Failure {
    fn from(e: HubError) -> Self {
        if e.is_transient() {
            Self::Retry(e)
        } else {
            Self::Fatal(e)
        }
    }
}

/// The file being written and the hash of what it holds, kept consistent with each other.
struct Partial<'a> {
    path: &'a Path,
    file: File,
    sum: Sum,
}

impl<'a> Partial<'a> {
    /// Opens (or creates) the partial file and hashes what it already holds.
    async fn open(path: &'a Path) -> Result<Self, HubError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .await
            .map_err(HubError::io(path))?;
        let mut sum = Sum::default();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match file.read(&mut buf).await.map_err(HubError::io(path))? {
                0 => break,
                n => sum.update(&buf[..n]),
            }
        }
        Ok(Self { path, file, sum })
    }

    fn len(&self) -> u64 {
        self.sum.len()
    }

    async fn restart(&mut self) -> Result<(), HubError> {
        self.file.set_len(0).await.map_err(HubError::io(self.path))?;
        self.file.seek(SeekFrom::Start(0)).await.map_err(HubError::io(self.path))?;
        self.sum = Sum::default();
        Ok(())
    }

    async fn append(&mut self, bytes: &[u8]) -> Result<(), HubError> {
        self.file.write_all(bytes).await.map_err(HubError::io(self.path))?;
        self.sum.update(bytes);
        Ok(())
    }
}

impl Hub {
    /// Downloads `remote` into `partial` (resuming what it already holds with a `Range`
    /// request), checks its size and sha256 against `expected` (else what the server announces)
    /// and renames it to `dest` (same filesystem: atomic). A download that proves wrong is
    /// deleted and an error returned: no unchecked byte ever carries `dest`'s name. A broken
    /// connection is retried a few times, each resuming; what was received is kept for the next
    /// call to resume. Progress goes to `progress(received, total)`.
    pub async fn download(
        &self,
        remote: &Remote,
        partial: &Path,
        dest: &Path,
        expected: &Known,
        mut progress: impl FnMut(u64, Option<u64>) + Send,
    ) -> Result<(), HubError> {
        let file = remote.name();
        let mut part = Partial::open(partial).await?;
        // What the caller knows wins over what the server says.
        let mut known = Known { size: expected.size, sha256: expected.sha256.as_deref().map(str::to_ascii_lowercase) };
        let mut attempt = 1;
        let total = loop {
            match self.transfer(remote, &mut part, &mut known, &mut progress).await {
                Ok(total) => break total,
                Err(Failure::Retry(error)) if attempt < ATTEMPTS => {
                    let (error, downloaded) = (error_chain(&error), part.len());
                    tracing::warn!(file, error, attempt, downloaded, "download interrupted; resuming");
                    tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(Failure::Retry(error) | Failure::Fatal(error)) => {
                    // What was received is kept for the next call to resume; an empty file is not.
                    if part.len() == 0 {
                        drop(part);
                        let _ = fs::remove_file(partial).await;
                    }
                    return Err(error);
                }
            }
        };
        let Partial { file: mut handle, sum, .. } = part;
        let corrupt = |error: HubError| async move {
            let _ = fs::remove_file(partial).await;
            error
        };
        let (len, actual) = sum.finish();
        if let Some(expected) = [total, known.size].into_iter().flatten().find(|&t| t != len) {
            return Err(corrupt(HubError::SizeMismatch { file, expected, actual: len }).await);
        }
        if let Some(expected) = known.sha256.filter(|s| *s != actual) {
            return Err(corrupt(HubError::Sha256Mismatch { file, expected, actual }).await);
        }
        handle.flush().await.map_err(HubError::io(partial))?;
        handle.sync_all().await.map_err(HubError::io(partial))?;
        drop(handle);
        fs::rename(partial, dest).await.map_err(HubError::io(dest))
    }

    /// One request: appends the body to `part` from where it ends; returns the total size the
    /// server announced.
    async fn transfer(
        &self,
        remote: &Remote,
        part: &mut Partial<'_>,
        known: &mut Known,
        progress: &mut (dyn FnMut(u64, Option<u64>) + Send),
    ) -> Result<Option<u64>, Failure> {
        let range = (part.len() > 0).then(|| format!("bytes={}-", part.len()));
        let Answer { mut response, announced } = self.send(Method::GET, remote, range.as_deref()).await?;
        known.size = known.size.or(announced.size);
        known.sha256 = known.sha256.take().or(announced.sha256);
        let url = response.url().clone();
        let total = match response.status() {
            StatusCode::RANGE_NOT_SATISFIABLE => {
                // The partial file may already be complete: `Content-Range: bytes */TOTAL`.
                let total = header(response.headers(), CONTENT_RANGE.as_str())
                    .and_then(|r| r.strip_prefix("bytes */")?.parse().ok())
                    .or(known.size);
                if total == Some(part.len()) {
                    return Ok(total);
                }
                let len = part.len();
                part.restart().await?;
                return Err(Failure::Retry(bad(&url, format!("HTTP 416 for a partial file of {len} bytes"))));
            }
            StatusCode::PARTIAL_CONTENT => {
                let range = header(response.headers(), CONTENT_RANGE.as_str()).unwrap_or_default();
                let (start, total) =
                    parse_content_range(range).ok_or_else(|| bad(&url, format!("bad Content-Range {range:?}")))?;
                if start != part.len() {
                    let len = part.len();
                    part.restart().await?;
                    return Err(Failure::Retry(bad(&url, format!("asked for bytes from {len}, got {range:?}"))));
                }
                total
            }
            _ => {
                response = self.check(response, remote)?;
                if part.len() > 0 {
                    // The server ignored the range and sends the whole file.
                    part.restart().await?;
                }
                response.content_length()
            }
        };
        progress(part.len(), total);
        while let Some(chunk) = response.chunk().await.map_err(|e| Failure::Retry(broken(&url, e)))? {
            part.append(&chunk).await?;
            // A server sending more than the file's known size is not sending that file: stop
            // before it fills the disk.
            if let Some(expected) = known.size.filter(|&s| part.len() > s) {
                let actual = part.len();
                part.restart().await?;
                return Err(Failure::Fatal(HubError::SizeMismatch { file: remote.name(), expected, actual }));
            }
            progress(part.len(), total);
        }
        if let Some(total) = total.filter(|&t| part.len() < t) {
            let source = io::Error::new(io::ErrorKind::UnexpectedEof, format!("{} of {total} bytes", part.len()));
            return Err(Failure::Retry(HubError::Transfer { url: shown(&url), source }));
        }
        Ok(total)
    }
}
