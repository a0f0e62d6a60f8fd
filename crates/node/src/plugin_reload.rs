//! Hot reload of engine plugins (spec 003): the supervisor reads every loaded plugin's
//! `manifest.json` every two seconds; when its `version` changed, the new plugin is opened
//! beside the old (its binary must report the new version: a half-copied folder is refused,
//! not loaded) and [`ModelManager::switch_plugin`] moves each model to it, shadow-loaded, with no
//! request dropped. A new version that is refused (ABI-incompatible, mismatched, unreadable)
//! leaves the old serving, and is tried again only when the version changes again.
//!
//! Replace a plugin's files by renaming new ones into place (`install -T`, `mv`), never by
//! writing into the old library: processes that have it mapped would run half-written code.
//!
//! The same poll finds engine folders that were not there (or not loadable) before: one that
//! loads now is added ([`ModelManager::add_plugins`]), and the models nothing could run are
//! added again. A folder refused is tried again when its files change.

use crate::engine::{vet_plugin, EngineIsolation};
use crate::models::ModelManager;
use llmr_engine_host::{abi, discover_engine, DiscoveryOptions, Manifest, Plugin, PluginState};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// How often the plugin folders are read.
const POLL: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct PluginWatcher {
    next: Instant,
    /// Per plugin folder: the version last refused, so it is not opened again every poll.
    refused: HashMap<PathBuf, String>,
    /// Where new engine folders appear, and which of their backend folders this node loads.
    engines_dir: PathBuf,
    options: DiscoveryOptions,
    /// New libraries are opened in a probe process first where engines run in workers.
    isolation: EngineIsolation,
    /// Engine folders with no plugin loaded: the newest modification time of their files when
    /// last tried, so they are tried again only when something in them changed.
    tried: HashMap<PathBuf, Option<SystemTime>>,
}

impl PluginWatcher {
    pub fn new(engines_dir: PathBuf, options: DiscoveryOptions, isolation: EngineIsolation) -> Self {
        PluginWatcher {
            next: Instant::now() + POLL,
            refused: HashMap::new(),
            engines_dir,
            options,
            isolation,
            tried: HashMap::new(),
        }
    }
}

/// The newest modification time of the files in an engine folder's backend folders.
fn newest_change(engine_dir: &Path) -> Option<SystemTime> {
    let backends = std::fs::read_dir(engine_dir).ok()?.flatten().map(|e| e.path()).filter(|p| p.is_dir());
    backends
        .flat_map(|b| std::fs::read_dir(b).into_iter().flatten().flatten())
        .filter_map(|f| f.metadata().ok()?.modified().ok())
        .max()
}

/// The `version` a plugin folder's manifest declares now, read without validating the rest.
fn declared_version(dir: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("version")?.as_str().map(str::to_owned)
}

impl PluginWatcher {
    /// One poll (at most every two seconds); returns the engines moved to a new version or
    /// added.
    pub async fn check(&mut self, models: &ModelManager) -> Vec<String> {
        if Instant::now() < self.next {
            return Vec::new();
        }
        self.next = Instant::now() + POLL;
        let mut reloaded = self.new_versions(models).await;
        reloaded.extend(self.new_engines(models).await);
        reloaded
    }

    /// Engine folders with no loaded plugin whose files changed since last tried: discovered
    /// as at start, and what loads is added.
    async fn new_engines(&mut self, models: &ModelManager) -> Vec<String> {
        let registry = models.registry();
        let loaded: Vec<PathBuf> =
            registry.plugins().iter().filter_map(|p| p.dir.parent().map(Path::to_path_buf)).collect();
        let candidates: Vec<PathBuf> = std::fs::read_dir(&self.engines_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir() && !loaded.contains(p))
            .collect();
        let mut added = Vec::new();
        for engine_dir in candidates {
            let stamp = newest_change(&engine_dir);
            match self.tried.get(&engine_dir) {
                Some(seen) if *seen == stamp => continue,
                // Seen empty at start or half-copied now: look again once it has settled.
                None if stamp.is_some_and(|t| t.elapsed().unwrap_or_default() < POLL) => continue,
                _ => {}
            }
            self.tried.insert(engine_dir.clone(), stamp);
            let (dir, options, mut scratch) = (engine_dir.clone(), self.options, (*registry).clone());
            let isolation = self.isolation.clone();
            let discovered = tokio::task::spawn_blocking(move || {
                discover_engine(&dir, &options, &mut scratch, &|d| vet_plugin(&isolation, d))
            });
            let Ok(found) = discovered.await else { continue };
            let plugins: Vec<std::sync::Arc<Plugin>> = found
                .iter()
                .filter_map(|f| match &f.state {
                    PluginState::Loaded(p) => Some(p.clone()),
                    _ => None,
                })
                .collect();
            if found.is_empty() {
                continue;
            }
            let reports = crate::agent::engines::engine_reports(&found);
            for p in &plugins {
                tracing::warn!(engine = p.id(), version = %p.manifest.version, "engine plugin added while serving");
                metrics::counter!(crate::metrics::PLUGIN_RELOADS, "engine" => p.id().to_owned()).increment(1);
                added.push(p.id().to_owned());
            }
            let served = models.add_plugins(plugins, reports);
            if !served.is_empty() {
                tracing::info!(models = ?served, "now served by an added engine plugin");
            }
        }
        added
    }

    /// Loaded plugins whose folder declares another version now: moved to it.
    async fn new_versions(&mut self, models: &ModelManager) -> Vec<String> {
        let mut reloaded = Vec::new();
        for old in models.registry().plugins().to_vec() {
            let Some(version) = declared_version(&old.dir) else { continue };
            if version == old.manifest.version.to_string() || self.refused.get(&old.dir) == Some(&version) {
                continue;
            }
            let dir = old.dir.clone();
            let isolation = self.isolation.clone();
            let opened = tokio::task::spawn_blocking(move || {
                let manifest = Manifest::load(&dir, abi::LLMR_ENGINE_ABI_MAJOR).map_err(|e| e.to_string())?;
                vet_plugin(&isolation, &dir)?;
                Plugin::open_again(&dir, manifest).map_err(|e| e.to_string())
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
