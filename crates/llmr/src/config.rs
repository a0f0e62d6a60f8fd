//! `llmr serve` settings: one TOML file, environment variables and flags naming the same
//! settings, in that order of precedence (a flag beats its env var, which beats the file).
//!
//! The file is `--config PATH`, else `$LLMR_CONFIG`, else `~/.llmr/config.toml` when present.

use anyhow::{Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The file's keys; each is also a `llmr serve` flag (`api_key` is `--api-key`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub api_key: Option<String>,
    /// Models to serve: store names, GGUF paths, or `ALIAS=PATH`. Empty: the whole store.
    pub models: Option<Vec<String>>,
    pub default_model: Option<String>,
    pub store: Option<PathBuf>,
    pub engines_dir: Option<PathBuf>,
    pub slots: Option<u32>,
    pub queue_limit: Option<usize>,
    pub threads: Option<u32>,
    pub ctx_size: Option<u32>,
    pub memory_budget_mib: Option<u64>,
    pub cache_mib: Option<usize>,
    pub body_limit_mib: Option<usize>,
    pub no_auth: Option<bool>,
}

pub fn default_config_path() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE"))?;
    Some(PathBuf::from(home).join(".llmr").join("config.toml"))
}

/// Reads the config file: the one named (which must exist), else the default one if present.
pub fn load(named: Option<&Path>) -> Result<FileConfig> {
    let path = match named {
        Some(p) => p.to_path_buf(),
        None => match default_config_path() {
            Some(p) if p.is_file() => p,
            _ => return Ok(FileConfig::default()),
        },
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_errors_that_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "port = 9000\nprot = 1\n").unwrap();
        let err = format!("{:#}", load(Some(&path)).unwrap_err());
        assert!(err.contains("prot"), "{err}");
        std::fs::write(&path, "port = 9000\nmodels = [\"a\", \"b=/x.gguf\"]\nslots = 2\n").unwrap();
        let c = load(Some(&path)).unwrap();
        assert_eq!((c.port, c.slots, c.models.unwrap().len()), (Some(9000), Some(2), 2));
        assert!(load(Some(&dir.path().join("missing.toml"))).is_err());
    }
}
