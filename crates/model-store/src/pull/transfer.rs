//! Downloading one file: redirects, resuming with `Range`, size and sha256 checks, retries.

use super::{partial_path, Expected, Hub, PullError, RemoteFile, ATTEMPTS, MAX_REDIRECTS};
use crate::name::ModelName;
use llmr_telemetry::error_chain;
use reqwest::blocking::Response;
use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, ETAG, LOCATION, RANGE};
use reqwest::{StatusCode, Url};
use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

/// What the hub said about a file: its size and, when it has one, its sha256.
#[derive(Debug, Default)]
struct Announced {
    size: Option<u64>,
    sha256: Option<String>,
}

/// An ETag that is a sha256 (`"<64 hex>"`, possibly weak); Hugging Face sends one for LFS files.
fn sha256_etag(value: &str) -> Option<String> {
    let v = value.trim().trim_start_matches("W/").trim_matches('"');
    (v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit())).then(|| v.to_ascii_lowercase())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// One file to download: where from, and how to name it in messages.
pub(super) struct Target<'a> {
    pub url: Url,
    /// The file's path in its repository (or its URL), for messages.
    pub file: &'a str,
    /// `Some` for a file of a hub repository: its statuses get the hub's messages.
    pub repo: Option<&'a ModelName>,
}

/// A failed try at a transfer: worth retrying (the connection dropped) or not.
enum Failure {
    Retry(PullError),
    Fatal(PullError),
}

impl From<PullError> for Failure {
    fn from(e: PullError) -> Self {
        Self::Fatal(e)
    }
}

/// The file being written, its hash and its length, kept consistent with each other.
struct Partial<'a> {
    path: &'a Path,
    file: File,
    hasher: Sha256,
    len: u64,
}

impl<'a> Partial<'a> {
    /// Opens (or creates) the partial file and hashes what it already holds.
    fn open(path: &'a Path) -> Result<Self, PullError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(PullError::io(path))?;
        let mut hasher = Sha256::new();
        let len = io::copy(&mut file, &mut HashWriter(&mut hasher)).map_err(PullError::io(path))?;
        Ok(Self { path, file, hasher, len })
    }

    fn restart(&mut self) -> Result<(), PullError> {
        self.file.set_len(0).map_err(PullError::io(self.path))?;
        self.file.seek(SeekFrom::Start(0)).map_err(PullError::io(self.path))?;
        self.hasher = Sha256::new();
        self.len = 0;
        Ok(())
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), PullError> {
        self.file.write_all(bytes).map_err(PullError::io(self.path))?;
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
        Ok(())
    }
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Hub {
    /// A GET without a range or retries (the repository listing).
    pub(super) fn get_plain(&self, url: Url) -> Result<Response, PullError> {
        self.get(url, 0, &mut Announced::default()).map_err(|(Failure::Retry(e) | Failure::Fatal(e))| e)
    }

    /// GET with manual redirects; the token goes only to the hub's own origin.
    fn get(&self, url: Url, range_from: u64, announced: &mut Announced) -> Result<Response, Failure> {
        let mut url = url;
        for _ in 0..MAX_REDIRECTS {
            let mut request = self.client.get(url.clone());
            if let Some(token) = self.token.as_ref().filter(|_| url.origin() == self.base.origin()) {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            if range_from > 0 {
                request = request.header(RANGE, format!("bytes={range_from}-"));
            }
            let response = request.send().map_err(|source| {
                let fatal = source.is_builder();
                let error = PullError::Request { url: url.to_string(), source: source.without_url() };
                if fatal {
                    Failure::Fatal(error)
                } else {
                    Failure::Retry(error)
                }
            })?;
            let headers = response.headers();
            if announced.sha256.is_none() {
                announced.sha256 = header(headers, "x-linked-etag").and_then(sha256_etag);
            }
            if announced.size.is_none() {
                announced.size = header(headers, "x-linked-size").and_then(|s| s.parse().ok());
            }
            if !response.status().is_redirection() {
                return Ok(response);
            }
            let location = header(headers, LOCATION.as_str()).ok_or_else(|| PullError::BadResponse {
                url: url.to_string(),
                reason: format!("HTTP {} without a Location", response.status().as_u16()),
            })?;
            url = url.join(location).map_err(|e| PullError::BadResponse {
                url: url.to_string(),
                reason: format!("bad redirect {location:?}: {e}"),
            })?;
        }
        Err(Failure::Fatal(PullError::BadResponse { url: url.to_string(), reason: "too many redirects".into() }))
    }

    /// Maps the statuses every answer shares; `file` is `None` for the repository listing.
    pub(super) fn check_status(
        &self,
        response: &Response,
        repo: &ModelName,
        file: Option<&str>,
    ) -> Result<(), PullError> {
        let status = response.status();
        let (repo, endpoint) = (repo.to_string(), self.endpoint().to_string());
        match status {
            s if s.is_success() || s == StatusCode::RANGE_NOT_SATISFIABLE => Ok(()),
            StatusCode::NOT_FOUND => Err(match file {
                None => PullError::RepoNotFound { repo, endpoint },
                Some(file) => PullError::FileNotFound { repo, file: file.to_string(), endpoint },
            }),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(PullError::Unauthorized {
                repo,
                endpoint,
                status: status.as_u16(),
                token_sent: self.token.is_some(),
            }),
            _ => Err(PullError::Http { url: response.url().to_string(), status: status.as_u16() }),
        }
    }

    /// Downloads `path` of the repository to `dest`, through `dest.partial`, which it resumes
    /// when present and removes when the content proves wrong.
    pub(super) fn download(
        &self,
        remote: &RemoteFile,
        path: &str,
        dest: &Path,
        progress: &mut dyn FnMut(u64, Option<u64>),
    ) -> Result<(), PullError> {
        let target = Target { url: self.file_url(&remote.repo, path), file: path, repo: Some(&remote.repo) };
        self.download_to(&target, &partial_path(dest), dest, &Expected::default(), progress)
    }

    /// Downloads `target` into `partial_path` (resuming what it holds), checks it against
    /// `expected` and what the server announced, and renames it to `dest`. A download that
    /// proves wrong is deleted.
    pub(super) fn download_to(
        &self,
        target: &Target,
        partial_path: &Path,
        dest: &Path,
        expected: &Expected,
        progress: &mut dyn FnMut(u64, Option<u64>),
    ) -> Result<(), PullError> {
        let path = target.file;
        let mut partial = Partial::open(partial_path)?;
        // What the caller knows wins over what the server says.
        let mut announced =
            Announced { size: expected.size, sha256: expected.sha256.as_deref().map(str::to_ascii_lowercase) };
        let mut attempt = 1;
        let total = loop {
            match self.transfer(target, &mut partial, &mut announced, progress) {
                Ok(total) => break total,
                Err(Failure::Retry(error)) if attempt < ATTEMPTS => {
                    let error = error_chain(&error);
                    tracing::warn!(
                        file = path,
                        error,
                        attempt,
                        downloaded = partial.len,
                        "download interrupted; resuming"
                    );
                    std::thread::sleep(Duration::from_millis(250 * u64::from(attempt)));
                    attempt += 1;
                }
                Err(Failure::Retry(error) | Failure::Fatal(error)) => {
                    // What was received is kept for the next pull to resume; an empty file is not.
                    if partial.len == 0 {
                        drop(partial);
                        let _ = fs::remove_file(partial_path);
                    }
                    return Err(error);
                }
            }
        };
        let Partial { file, hasher, len, .. } = partial;
        let corrupt = |error: PullError| {
            let _ = fs::remove_file(partial_path);
            error
        };
        if let Some(expected) = [total, announced.size].into_iter().flatten().find(|&t| t != len) {
            return Err(corrupt(PullError::SizeMismatch { file: path.to_string(), expected, actual: len }));
        }
        let actual = format!("{:x}", hasher.finalize());
        if let Some(expected) = announced.sha256.filter(|s| *s != actual) {
            return Err(corrupt(PullError::Sha256Mismatch { file: path.to_string(), expected, actual }));
        }
        file.sync_all().map_err(PullError::io(partial_path))?;
        drop(file);
        fs::rename(partial_path, dest).map_err(PullError::io(dest))
    }

    /// One request: appends the body to `partial` from where it ends; returns the total size
    /// the server announced.
    fn transfer(
        &self,
        target: &Target,
        partial: &mut Partial,
        announced: &mut Announced,
        progress: &mut dyn FnMut(u64, Option<u64>),
    ) -> Result<Option<u64>, Failure> {
        let mut response = self.get(target.url.clone(), partial.len, announced)?;
        let checked = match target.repo {
            Some(repo) => self.check_status(&response, repo, Some(target.file)),
            None => check_plain_status(&response),
        };
        checked.map_err(|error| match error {
            PullError::Http { status, .. } if status >= 500 => Failure::Retry(error),
            error => Failure::Fatal(error),
        })?;
        let url_s = response.url().to_string();
        let bad = |reason: String| PullError::BadResponse { url: url_s.clone(), reason };
        let total = match response.status() {
            StatusCode::PARTIAL_CONTENT => {
                let range = header(response.headers(), CONTENT_RANGE.as_str()).unwrap_or_default();
                let (start, total) =
                    parse_content_range(range).ok_or_else(|| bad(format!("bad Content-Range {range:?}")))?;
                if start != partial.len {
                    partial.restart()?;
                    return Err(Failure::Retry(bad(format!("asked for bytes from {}, got {range:?}", partial.len))));
                }
                total
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                // The partial file may already be complete: `Content-Range: bytes */TOTAL`.
                let total = header(response.headers(), CONTENT_RANGE.as_str())
                    .and_then(|r| r.strip_prefix("bytes */")?.parse().ok())
                    .or(announced.size);
                if total == Some(partial.len) {
                    return Ok(total);
                }
                partial.restart()?;
                return Err(Failure::Retry(bad(format!("HTTP 416 for a partial file of {} bytes", partial.len))));
            }
            _ => {
                if partial.len > 0 {
                    // The server ignored the range and sends the whole file.
                    partial.restart()?;
                }
                header(response.headers(), CONTENT_LENGTH.as_str()).and_then(|l| l.parse().ok())
            }
        };
        // A plain ETag is trusted as a sha256 only from the hub itself, not from a CDN it
        // redirected to (whose ETags mean something else).
        if announced.sha256.is_none() && response.url().origin() == self.base.origin() {
            announced.sha256 = header(response.headers(), ETAG.as_str()).and_then(sha256_etag);
        }
        progress(partial.len, total);
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match response.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    partial.append(&buf[..n])?;
                    // A server sending more than the file's known size is not sending that file:
                    // stop before it fills the disk.
                    if let Some(size) = announced.size.filter(|&s| partial.len > s) {
                        let actual = partial.len;
                        partial.restart()?;
                        return Err(Failure::Fatal(PullError::SizeMismatch {
                            file: target.file.to_string(),
                            expected: size,
                            actual,
                        }));
                    }
                    progress(partial.len, total);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(Failure::Retry(PullError::Transfer { url: url_s, source })),
            }
        }
        if let Some(total) = total.filter(|&t| partial.len < t) {
            let source = io::Error::new(io::ErrorKind::UnexpectedEof, format!("{} of {total} bytes", partial.len));
            return Err(Failure::Retry(PullError::Transfer { url: url_s, source }));
        }
        Ok(total)
    }
}

pub(super) fn sha256_file(path: &Path) -> io::Result<String> {
    let mut hasher = Sha256::new();
    io::copy(&mut File::open(path)?, &mut HashWriter(&mut hasher))?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// Statuses of a plain URL (not a hub repository's file).
fn check_plain_status(response: &Response) -> Result<(), PullError> {
    let status = response.status();
    if status.is_success() || status == StatusCode::RANGE_NOT_SATISFIABLE {
        Ok(())
    } else {
        Err(PullError::Http { url: response.url().to_string(), status: status.as_u16() })
    }
}

/// `bytes START-END/TOTAL` (TOTAL may be `*`).
fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let (range, total) = value.strip_prefix("bytes ")?.split_once('/')?;
    let (start, _end) = range.split_once('-')?;
    let total = if total == "*" { None } else { Some(total.parse().ok()?) };
    Some((start.parse().ok()?, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_etags_and_content_ranges() {
        let sha = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
        assert_eq!(sha256_etag(&format!("\"{sha}\"")).as_deref(), Some(sha));
        assert_eq!(sha256_etag(&format!("W/\"{}\"", sha.to_uppercase())).as_deref(), Some(sha));
        assert_eq!(sha256_etag("\"0123456789abcdef0123456789abcdef01234567\""), None, "a git sha1 is not one");
        assert_eq!(parse_content_range("bytes 100-199/200"), Some((100, Some(200))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }
}
