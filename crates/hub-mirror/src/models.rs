//! Where the real files tests serve come from: the model cache `scripts/fetch-models` fills
//! (`$LLMR_MODEL_CACHE`, else `~/.cache/llmr/models`), each file checked against a pinned sha256.

use std::path::{Path, PathBuf};

/// `$LLMR_MODEL_CACHE`, else `~/.cache/llmr/models`.
pub fn model_cache() -> PathBuf {
    match std::env::var_os("LLMR_MODEL_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache/llmr/models"),
    }
}

/// A real model file from the cache (`asset` is its `scripts/fetch-models` name); fails (never
/// skips) when it has not been fetched.
pub fn real_model(asset: &str, file: &str) -> PathBuf {
    let path = model_cache().join(file);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/fetch-models {asset}` (or set LLMR_MODEL_CACHE to the cache)",
        path.display()
    );
    path
}

/// The sha256 `scripts/fetch-models` verified and recorded beside a cached model (`FILE.sha256`).
pub fn recorded_sha256(model: &Path) -> String {
    let sidecar = format!("{}.sha256", model.display());
    let text = std::fs::read_to_string(&sidecar).unwrap_or_else(|e| panic!("{sidecar}: {e}"));
    text.split_whitespace().next().unwrap().to_string()
}

/// Puts `target` at `link` (its folders made): a symbolic link, so a large model is served from
/// the cache without a copy (a copy where there are no symbolic links).
pub fn link(target: &Path, link: &Path) {
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(target, link).unwrap();
    #[cfg(not(unix))]
    std::fs::copy(target, link).map(drop).unwrap();
}
