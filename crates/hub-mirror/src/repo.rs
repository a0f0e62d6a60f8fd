//! The repositories a mirror serves: each a directory scanned once at start, every file hashed
//! once (and the hashes kept for the whole process, so mirrors started by several tests over the
//! same large model file hash it once).

use sha1::Sha1;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// Files larger than this are what Hugging Face stores in LFS: their listing entry has an `lfs`
/// object and their download carries `X-Linked-Etag` / `X-Linked-Size`.
pub const LFS_THRESHOLD: u64 = 10 * 1024 * 1024;

/// One file of a repository.
#[derive(Debug)]
pub(crate) struct RepoFile {
    /// Where the bytes are (symbolic links are followed when reading).
    pub local: PathBuf,
    pub size: u64,
    pub sha256: String,
    /// The git blob id Hugging Face reports: of the content for a plain file, of the LFS pointer
    /// for an LFS file.
    pub blob_id: String,
}

impl RepoFile {
    pub fn is_lfs(&self) -> bool {
        self.size > LFS_THRESHOLD
    }
}

#[derive(Debug)]
pub(crate) struct Repo {
    /// A commit id (40 hex) derived from the files, so it changes when they do.
    pub sha: String,
    /// Repository path (`/`-separated) -> file.
    pub files: BTreeMap<String, RepoFile>,
}

/// Checks `owner/name`.
pub(crate) fn check_repo_id(id: &str) -> io::Result<()> {
    let parts: Vec<&str> = id.split('/').collect();
    let plain = |p: &&str| {
        !p.is_empty() && *p != "." && *p != ".." && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    if parts.len() != 2 || !parts.iter().all(plain) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("repository id {id:?} is not 'owner/name'")));
    }
    Ok(())
}

/// Scans `dir` recursively (following symbolic links, skipping `.git`) and hashes every file.
/// Blocking: call it from a blocking task.
pub(crate) fn scan(dir: &Path) -> io::Result<Repo> {
    let mut found = Vec::new();
    walk(dir, "", &mut found, 0)?;
    let mut files = BTreeMap::new();
    for (path, local) in found {
        let digests = digests(&local)?;
        let blob_id = if digests.size > LFS_THRESHOLD {
            let pointer = format!(
                "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize {}\n",
                digests.sha256, digests.size
            );
            git_blob_id(pointer.as_bytes())
        } else {
            digests.blob_id.clone()
        };
        files.insert(path, RepoFile { local, size: digests.size, sha256: digests.sha256.clone(), blob_id });
    }
    let mut commit = Sha1::new();
    for (path, file) in &files {
        commit.update(format!("{path}\0{}\n", file.blob_id));
    }
    Ok(Repo { sha: hex(&commit.finalize()), files })
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, PathBuf)>, depth: u32) -> io::Result<()> {
    if depth > 16 {
        return Err(io::Error::other(format!("{}: directories nested too deep (a link loop?)", dir.display())));
    }
    let context = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", dir.display()));
    for entry in std::fs::read_dir(dir).map_err(context)? {
        let entry = entry.map_err(context)?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name == ".git" {
            continue;
        }
        let local = entry.path();
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        // `metadata` follows symbolic links: a repository file may link to a shared model file.
        let meta = std::fs::metadata(&local).map_err(context)?;
        if meta.is_dir() {
            walk(&local, &rel, out, depth + 1)?;
        } else if meta.is_file() {
            out.push((rel, local));
        }
    }
    Ok(())
}

#[derive(Debug)]
struct Digests {
    size: u64,
    sha256: String,
    /// Git blob id of the content; only computed for files up to [`LFS_THRESHOLD`].
    blob_id: String,
}

type CacheKey = (PathBuf, u64, Option<SystemTime>);

fn cache() -> &'static Mutex<HashMap<CacheKey, Arc<Digests>>> {
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Arc<Digests>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn digests(path: &Path) -> io::Result<Arc<Digests>> {
    let context = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let canonical = path.canonicalize().map_err(context)?;
    let meta = std::fs::metadata(&canonical).map_err(context)?;
    let key = (canonical.clone(), meta.len(), meta.modified().ok());
    if let Some(found) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(found.clone());
    }
    let small = meta.len() <= LFS_THRESHOLD;
    let mut sha256 = Sha256::new();
    let mut git = Sha1::new();
    git.update(format!("blob {}\0", meta.len()));
    let mut file = File::open(&canonical).map_err(context)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(context(e)),
        };
        sha256.update(&buf[..n]);
        if small {
            git.update(&buf[..n]);
        }
        size += n as u64;
    }
    if size != meta.len() {
        return Err(context(io::Error::other("the file changed while it was hashed")));
    }
    let digests = Arc::new(Digests {
        size,
        sha256: hex(&sha256.finalize()),
        blob_id: if small { hex(&git.finalize()) } else { String::new() },
    });
    cache().lock().unwrap_or_else(|e| e.into_inner()).insert(key, digests.clone());
    Ok(digests)
}

fn git_blob_id(content: &[u8]) -> String {
    let mut git = Sha1::new();
    git.update(format!("blob {}\0", content.len()));
    git.update(content);
    hex(&git.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_ids_are_git_hash_object() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(git_blob_id(b"hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
    }

    #[test]
    fn repo_ids_are_owner_slash_name() {
        assert!(check_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct").is_ok());
        for bad in ["gpt2", "a/b/c", "../x", "a/..", "a b/c", "/x"] {
            assert!(check_repo_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scans_nested_files_and_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sub/.git")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), b"hello\n").unwrap();
        std::fs::write(dir.path().join("sub/.git/HEAD"), b"x").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("sub/a.txt"), dir.path().join("link.txt")).unwrap();
        let repo = scan(dir.path()).unwrap();
        let names: Vec<&str> = repo.files.keys().map(String::as_str).collect();
        #[cfg(unix)]
        assert_eq!(names, ["link.txt", "sub/a.txt"]);
        let a = &repo.files["sub/a.txt"];
        assert_eq!(a.size, 6);
        assert_eq!(a.blob_id, "ce013625030ba8dba906f756967f9e9ca394464a");
        assert_eq!(a.sha256, "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03");
        assert!(!a.is_lfs());
        assert_eq!(repo.sha.len(), 40);
    }
}
