//! sha256 as hubs use it: ETags that carry one, bodies and files hashed as they stream by.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// Whether `s` is a sha256 in hex (either case).
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The sha256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut sum = Sum::default();
    sum.update(bytes);
    sum.finish().1
}

/// Size and sha256 (lower-case hex) of a local file, read in chunks. Blocking (and slow for
/// large files): call it from a blocking thread.
pub fn sha256_file(path: &Path) -> io::Result<(u64, String)> {
    let mut sum = Sum::default();
    io::copy(&mut File::open(path)?, &mut sum)?;
    Ok(sum.finish())
}

/// An ETag that is a sha256 (`"<64 hex>"`, possibly weak); Hugging Face sends one for LFS files.
pub(crate) fn sha256_etag(value: &str) -> Option<String> {
    let v = value.trim().trim_start_matches("W/").trim_matches('"');
    is_sha256(v).then(|| v.to_ascii_lowercase())
}

/// A running sha256 and byte count.
#[derive(Clone, Default)]
pub(crate) struct Sum {
    hasher: Sha256,
    len: u64,
}

impl Sum {
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Size and lower-case hex sha256.
    pub fn finish(self) -> (u64, String) {
        (self.len, format!("{:x}", self.hasher.finalize()))
    }
}

impl Write for Sum {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_etags_files_and_bytes() {
        let sha = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
        assert_eq!(sha256_etag(&format!("\"{sha}\"")).as_deref(), Some(sha));
        assert_eq!(sha256_etag(&format!("W/\"{}\"", sha.to_uppercase())).as_deref(), Some(sha));
        assert_eq!(sha256_etag("\"0123456789abcdef0123456789abcdef01234567\""), None, "a git sha1 is not one");
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(sha256_hex(b""), empty);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"abc").unwrap();
        assert_eq!(sha256_file(&dir.path().join("f")).unwrap(), (3, sha256_hex(b"abc")));
        assert!(sha256_file(&dir.path().join("absent")).is_err());
    }
}
