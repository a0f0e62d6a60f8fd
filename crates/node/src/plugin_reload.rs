//! Hot reload of engine plugins (spec 003): the supervisor reads every loaded plugin's
//! `manifest.json` every two seconds; when its `version` changed, the new plugin is opened
//! beside the old (its binary must report the new version: a half-copied folder is refused,
//! not loaded) and [`ModelManager::switch_plugin`] moves each model to it, shadow-loaded, with no
//! request dropped. A new version that is refused (ABI-incompatible, mismatched, unreadable)
//! leaves the old serving, and is tried again only when the version changes again.
//!
//! Replace a plugin's files by renaming new ones into place (`install -T`, `mv`), never by
//! writing into the old library: processes that have it mapped would run half-written code.

use crate::models::ModelManager;
use llmr_engine_host::{abi, Manifest, Plugin};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often the plugin folders are read.
const POLL: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct PluginWatcher {
    next: Instant,
    /// Per plugin folder: the version last refused, so it is not opened again every poll.
    refused: HashMap<PathBuf, String>,
}

impl Default for PluginWatcher {
    fn default() -> Self {
        PluginWatcher { next: Instant::now() + POLL, refused: HashMap::new() }
    }
}

/// The `version` a plugin folder's manifest declares now, read without validating the rest.
fn declared_version(dir: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("version")?.as_str().map(str::to_owned)
}

impl PluginWatcher {
    /// One poll (at most every two seconds); returns the engines moved to a new version.
    pub async fn check(&mut self, models: &ModelManager) -> Vec<String> {
        if Instant::now() < self.next {
            return Vec::new();
        }
        self.next = Instant::now() + POLL;
        let mut reloaded = Vec::new();
        for old in models.registry().plugins().to_vec() {
            let Some(version) = declared_version(&old.dir) else { continue };
            if version == old.manifest.version.to_string() || self.refused.get(&old.dir) == Some(&version) {
                continue;
            }
            let dir = old.dir.clone();
            let opened = tokio::task::spawn_blocking(move || {
                let manifest = Manifest::load(&dir, abi::LLMR_ENGINE_ABI_MAJOR)?;
                Plugin::open_again(&dir, manifest)
            })
            .await;
            match opened {
                Ok(Ok(new)) => {
                    tracing::warn!(
                        engine = old.id(),
                        "engine '{}' changed from {} to {}: moving its models to the new version",
                        old.id(),
                        old.manifest.version,
                        new.manifest.version
                    );
                    let moved = models.switch_plugin(&old, new).await;
                    metrics::counter!(crate::metrics::PLUGIN_RELOADS, "engine" => old.id().to_owned()).increment(1);
                    tracing::warn!(engine = old.id(), models = moved, "engine reloaded");
                    self.refused.remove(&old.dir);
                    reloaded.push(old.id().to_owned());
                }
                Ok(Err(e)) => {
                    tracing::error!(
                        engine = old.id(),
                        "version {version} in {} refused, {} keeps serving: {e}",
                        old.dir.display(),
                        old.manifest.version
                    );
                    self.refused.insert(old.dir.clone(), version);
                }
                Err(e) => tracing::error!(engine = old.id(), "opening the new version panicked: {e}"),
            }
        }
        reloaded
    }
}
