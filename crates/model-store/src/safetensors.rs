//! The spec 003 rules for a safetensors model directory: `config.json` and `tokenizer.json` are
//! required; the primary file is the `*.safetensors.index.json` (every shard it names must be
//! present) or else the only `*.safetensors`; several `.safetensors` without an index are
//! ambiguous. Architecture and context length come from `config.json`.

use crate::layout::{has_extension, DirListing};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CONFIG: &str = "config.json";
const TOKENIZER: &str = "tokenizer.json";
const INDEX_SUFFIX: &str = ".safetensors.index.json";
const WEIGHTS_SUFFIX: &str = ".safetensors";

#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("{}: {file} is missing (required for safetensors models)", dir.display())]
    MissingFile { dir: PathBuf, file: &'static str },
    #[error("{}: several *.safetensors files and no *.safetensors.index.json, so the primary file is ambiguous: {}", dir.display(), files.join(", "))]
    Ambiguous { dir: PathBuf, files: Vec<String> },
    #[error("{}: several *.safetensors.index.json files: {}", dir.display(), files.join(", "))]
    SeveralIndexes { dir: PathBuf, files: Vec<String> },
    #[error("{}: no *.safetensors or *.safetensors.index.json file", dir.display())]
    NoWeights { dir: PathBuf },
    #[error("{}: shards named by the index are missing: {}", index.display(), missing.join(", "))]
    MissingShards { index: PathBuf, missing: Vec<String> },
    #[error("{}: shard name {shard:?} is not a plain *.safetensors file name in the model directory", index.display())]
    UnsafeShardName { index: PathBuf, shard: String },
    #[error("{}: the weight_map is empty", index.display())]
    EmptyIndex { index: PathBuf },
    #[error("{}: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: neither model_type nor architectures is set", path.display())]
    MissingArchitecture { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A checked safetensors model directory.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SafetensorsModel {
    /// The index, or the single weights file.
    pub primary: PathBuf,
    /// Every weights file (the shards, or the single file).
    pub weights: Vec<PathBuf>,
    pub architecture: String,
    pub context_length: Option<u64>,
    pub vision: bool,
}

/// The parts of `config.json` the store reads. Multimodal configs keep the language model's
/// settings under `text_config`.
#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    max_position_embeddings: Option<u64>,
    text_config: Option<RawTextConfig>,
    vision_config: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawTextConfig {
    max_position_embeddings: Option<u64>,
}

#[derive(Deserialize)]
struct RawIndex {
    weight_map: BTreeMap<String, String>,
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, SafetensorsError> {
    let bytes = std::fs::read(path).map_err(|source| SafetensorsError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_slice(&bytes).map_err(|source| SafetensorsError::Json { path: path.to_path_buf(), source })
}

pub(crate) fn inspect(listing: &DirListing) -> Result<SafetensorsModel, SafetensorsError> {
    let dir = &listing.dir;
    let has = |name: &str| listing.files.iter().any(|f| f == name);
    for file in [CONFIG, TOKENIZER] {
        if !has(file) {
            return Err(SafetensorsError::MissingFile { dir: dir.clone(), file });
        }
    }
    let (primary, weights) = primary_and_weights(listing)?;

    let config_path = dir.join(CONFIG);
    let config: RawConfig = read_json(&config_path)?;
    let architecture = config
        .model_type
        .or_else(|| config.architectures.into_iter().next())
        .ok_or(SafetensorsError::MissingArchitecture { path: config_path })?;
    let context_length =
        config.max_position_embeddings.or_else(|| config.text_config.and_then(|t| t.max_position_embeddings));
    Ok(SafetensorsModel { primary, weights, architecture, context_length, vision: config.vision_config.is_some() })
}

fn primary_and_weights(listing: &DirListing) -> Result<(PathBuf, Vec<PathBuf>), SafetensorsError> {
    let dir = &listing.dir;
    let with_suffix =
        |suffix: &str| -> Vec<String> { listing.files.iter().filter(|f| has_extension(f, suffix)).cloned().collect() };
    let indexes = with_suffix(INDEX_SUFFIX);
    if indexes.len() > 1 {
        return Err(SafetensorsError::SeveralIndexes { dir: dir.clone(), files: indexes });
    }
    if let Some(index_name) = indexes.into_iter().next() {
        let index = dir.join(index_name);
        let shards = shards_of(&index)?;
        let missing: Vec<String> = shards.iter().filter(|s| !listing.files.contains(s)).cloned().collect();
        if !missing.is_empty() {
            return Err(SafetensorsError::MissingShards { index, missing });
        }
        let weights = shards.iter().map(|s| dir.join(s)).collect();
        return Ok((index, weights));
    }
    match with_suffix(WEIGHTS_SUFFIX).as_slice() {
        [] => Err(SafetensorsError::NoWeights { dir: dir.clone() }),
        [single] => Ok((dir.join(single), vec![dir.join(single)])),
        several => Err(SafetensorsError::Ambiguous { dir: dir.clone(), files: several.to_vec() }),
    }
}

/// The distinct shard file names of an index, each checked to be a plain file name: the index is
/// data from outside and must not point the engine out of the model directory.
fn shards_of(index: &Path) -> Result<BTreeSet<String>, SafetensorsError> {
    let raw: RawIndex = read_json(index)?;
    if raw.weight_map.is_empty() {
        return Err(SafetensorsError::EmptyIndex { index: index.to_path_buf() });
    }
    let shards: BTreeSet<String> = raw.weight_map.into_values().collect();
    if let Some(bad) = shards.iter().find(|s| !is_plain_weights_name(s)) {
        return Err(SafetensorsError::UnsafeShardName { index: index.to_path_buf(), shard: bad.clone() });
    }
    Ok(shards)
}

fn is_plain_weights_name(name: &str) -> bool {
    has_extension(name, WEIGHTS_SUFFIX) && !name.starts_with('.') && !name.contains(['/', '\\', '\0', ':'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_must_stay_in_the_directory() {
        assert!(is_plain_weights_name("model-00001-of-00002.safetensors"));
        for bad in
            ["../x.safetensors", "/abs.safetensors", "a\\b.safetensors", ".safetensors", "x.bin", "C:x.safetensors"]
        {
            assert!(!is_plain_weights_name(bad), "{bad}");
        }
    }
}
