//! A model at a path every node can read (a shared mount): a directory, listed like a
//! repository, or one GGUF file (with its split parts). Files are hashed in place.

use super::RegisterError;
use llmr_cluster::check_relative_path;
use llmr_hub::{sha256_file, ListedFile};
use llmr_model_store::{is_gguf, split_part, split_part_name};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

/// Bounds for a directory walk (a mount pointed at the wrong place should fail, not hang).
const MAX_FILES: usize = 100_000;
const MAX_DEPTH: u32 = 8;

/// What `path` named.
pub(super) struct LocalModel {
    /// The model directory (the manifest's `source.dir`).
    pub dir: PathBuf,
    pub files: Vec<ListedFile>,
    /// `Some(name)` when `path` named one file (the file to register).
    pub file: Option<String>,
    /// The default served name: the file's stem, or the directory's name.
    pub stem: Option<String>,
}

fn bad_path(message: impl Into<String>) -> RegisterError {
    RegisterError::invalid("path", message)
}

fn io_error(path: &Path, e: io::Error) -> RegisterError {
    match e.kind() {
        io::ErrorKind::NotFound => RegisterError::not_found("path", format!("{} does not exist", path.display())),
        _ => bad_path(format!("{}: {e}", path.display())),
    }
}

/// Checks `path` (absolute, no `.`/`..`) and lists it. Blocking.
pub(super) fn open(path: &str) -> Result<LocalModel, RegisterError> {
    let path = Path::new(path);
    if !path.is_absolute() {
        return Err(bad_path("must be an absolute path that every node can read"));
    }
    if path.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
        return Err(bad_path("must not contain '.' or '..' components"));
    }
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    let name_of = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_string);
    if meta.is_dir() {
        let mut files = Vec::new();
        walk(path, "", &mut files, 0)?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        return Ok(LocalModel { dir: path.to_path_buf(), files, file: None, stem: name_of(path) });
    }
    let file_name = name_of(path).ok_or_else(|| bad_path("the file name is not UTF-8"))?;
    // A whisper.cpp model is one file too (`ggml-*.bin`, by its name as on every hub).
    let whisper = file_name.starts_with("ggml-") && file_name.ends_with(".bin");
    if !is_gguf(&file_name) && !whisper {
        return Err(bad_path(
            "a file must be a .gguf or a whisper.cpp ggml-*.bin model; give the directory of a safetensors model or a Piper voice",
        ));
    }
    let dir = path.parent().ok_or_else(|| bad_path("has no parent directory"))?.to_path_buf();
    let mut names = vec![file_name.clone()];
    if let Some((prefix, 1, count)) = split_part(&file_name) {
        names.extend((2..=count).map(|part| split_part_name(prefix, part, count)).filter(|n| dir.join(n).is_file()));
    }
    let mut files = Vec::new();
    for name in names {
        let size = std::fs::metadata(dir.join(&name)).map_err(|e| io_error(&dir.join(&name), e))?.len();
        files.push(ListedFile { path: name, size: Some(size), sha256: None });
    }
    let stem = file_name.rsplit_once('.').map_or(file_name.as_str(), |(stem, _)| stem).to_string();
    Ok(LocalModel { dir, files, file: Some(file_name), stem: Some(stem) })
}

/// Lists files under `dir` as `/`-separated relative paths, following symbolic links and
/// skipping hidden entries (`.cache`, partial downloads).
fn walk(dir: &Path, prefix: &str, out: &mut Vec<ListedFile>, depth: u32) -> Result<(), RegisterError> {
    if depth > MAX_DEPTH {
        return Err(bad_path(format!("{}: directories nest deeper than {MAX_DEPTH} levels", dir.display())));
    }
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Err(bad_path(format!("{}: a file name is not UTF-8: {name:?}", dir.display())));
        };
        if name.starts_with('.') {
            continue;
        }
        let rel = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
        if let Err(problem) = check_relative_path(&rel) {
            return Err(bad_path(format!("{}: the file name {name:?} {problem}", dir.display())));
        }
        let meta = std::fs::metadata(entry.path()).map_err(|e| io_error(&entry.path(), e))?;
        if meta.is_dir() {
            walk(&entry.path(), &rel, out, depth + 1)?;
        } else if meta.is_file() {
            if out.len() >= MAX_FILES {
                return Err(bad_path(format!("more than {MAX_FILES} files: is this a model directory?")));
            }
            out.push(ListedFile { path: rel, size: Some(meta.len()), sha256: None });
        }
    }
    Ok(())
}

/// Size and sha256 of a local file, read in chunks. Blocking.
pub(super) fn hash_file(path: &Path) -> Result<(u64, String), RegisterError> {
    sha256_file(path).map_err(|e| io_error(path, e))
}

/// A small file's content, refusing one over `limit` bytes. Blocking.
pub(super) fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, RegisterError> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| io_error(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(bad_path(format!("{} is larger than {limit} bytes", path.display())));
    }
    Ok(bytes)
}
