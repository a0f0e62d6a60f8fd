//! EngineRegistry: which loaded plugin serves a model, decided from (runtime, format,
//! architecture). The architecture always comes from the model's own metadata (`config.json`
//! `model_type`/`architectures`, or the GGUF `general.architecture`), never a private file.

use crate::manifest::{Manifest, ManifestError};
use crate::plugin::Plugin;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Default, Debug, Clone)]
pub struct EngineRegistry {
    /// In registration order (the last tie-breaker).
    plugins: Vec<Arc<Plugin>>,
}

/// What a model needs from an engine.
#[derive(Clone, Debug, Default)]
pub struct ModelRequirements<'a> {
    /// RuntimeType name, when the model's registration fixed one.
    pub runtime: Option<&'a str>,
    pub format: &'a str,
    pub architecture: &'a str,
    /// Benchmark scores recorded for this model: engine_id -> score (higher is better).
    pub scores: Option<&'a HashMap<String, f64>>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("No engine plugin handles format '{format}'{}", runtime_suffix(.runtime))]
    NoEngineForFormat { format: String, runtime: Option<String> },
    #[error("{}", .0.join("; "))]
    UnsupportedArchitecture(Vec<String>),
}

fn runtime_suffix(runtime: &Option<String>) -> String {
    runtime.as_ref().map(|r| format!(" with runtime '{r}'")).unwrap_or_default()
}

fn same(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

impl EngineRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn plugins(&self) -> &[Arc<Plugin>] {
        &self.plugins
    }

    pub fn get(&self, engine_id: &str) -> Option<&Arc<Plugin>> {
        self.plugins.iter().find(|p| p.id() == engine_id)
    }

    /// Refuses an id that is already loaded, whatever its version (spec: the second is refused).
    pub fn check_id_free(&self, manifest: &Manifest) -> Result<(), ManifestError> {
        match self.get(&manifest.id) {
            Some(_) => Err(ManifestError::IdConflict(manifest.id.clone())),
            None => Ok(()),
        }
    }

    pub fn register(&mut self, plugin: Arc<Plugin>) -> Result<(), ManifestError> {
        self.check_id_free(&plugin.manifest)?;
        self.plugins.push(plugin);
        Ok(())
    }

    /// This registry with `plugin` in the place of the plugin of its id (a new version of it,
    /// hot reloaded), or added last when none has that id.
    pub fn with_replaced(&self, plugin: Arc<Plugin>) -> EngineRegistry {
        let mut plugins = self.plugins.clone();
        match plugins.iter().position(|p| p.id() == plugin.id()) {
            Some(i) => plugins[i] = plugin,
            None => plugins.push(plugin),
        }
        EngineRegistry { plugins }
    }

    /// Removes a plugin; the library closes once the last instance using it is gone.
    pub fn unregister(&mut self, engine_id: &str) -> Option<Arc<Plugin>> {
        let i = self.plugins.iter().position(|p| p.id() == engine_id)?;
        Some(self.plugins.remove(i))
    }

    /// Every architecture some loaded plugin supports, sorted and deduplicated.
    pub fn supported_architectures(&self) -> Vec<String> {
        let mut all: Vec<String> = self.plugins.iter().flat_map(|p| p.manifest.architectures.iter().cloned()).collect();
        all.sort();
        all.dedup();
        all
    }

    /// Every plugin that can run a model, in registration order; an error says why none can.
    pub fn candidates(&self, req: &ModelRequirements<'_>) -> Result<Vec<Arc<Plugin>>, ResolveError> {
        let by_format: Vec<&Arc<Plugin>> = self
            .plugins
            .iter()
            .filter(|p| req.runtime.is_none_or(|r| p.manifest.runtimes.iter().any(|x| same(x, r))))
            .filter(|p| p.manifest.formats.iter().any(|f| same(f, req.format)))
            .collect();
        if by_format.is_empty() {
            return Err(ResolveError::NoEngineForFormat {
                format: req.format.to_string(),
                runtime: req.runtime.map(str::to_string),
            });
        }
        let candidates: Vec<Arc<Plugin>> = by_format
            .iter()
            .filter(|p| p.manifest.architectures.iter().any(|a| same(a, req.architecture)))
            .map(|p| (*p).clone())
            .collect();
        if candidates.is_empty() {
            return Err(ResolveError::UnsupportedArchitecture(
                by_format
                    .iter()
                    .map(|p| {
                        format!(
                            "Model architecture '{}' is not supported by plugin '{}'. Supported: {:?}",
                            req.architecture,
                            p.id(),
                            p.manifest.architectures
                        )
                    })
                    .collect(),
            ));
        }
        Ok(candidates)
    }

    /// Picks the plugin for a model: the highest benchmark score for it, else a third-party
    /// plugin before a built-in one, else the first registered (with a warning when there was
    /// a choice).
    pub fn resolve(&self, req: &ModelRequirements<'_>) -> Result<Arc<Plugin>, ResolveError> {
        let candidates = self.candidates(req)?;
        if candidates.len() == 1 {
            return Ok(candidates[0].clone());
        }
        let score = |p: &Arc<Plugin>| req.scores.and_then(|s| s.get(p.id()).copied());
        if let Some(best) = candidates
            .iter()
            .filter(|p| score(p).is_some())
            .max_by(|a, b| score(a).partial_cmp(&score(b)).unwrap_or(std::cmp::Ordering::Equal))
        {
            return Ok((*best).clone());
        }
        let chosen = candidates.iter().find(|p| !p.manifest.builtin).unwrap_or(&candidates[0]);
        tracing::warn!(
            architecture = req.architecture,
            format = req.format,
            chosen = chosen.id(),
            candidates = ?candidates.iter().map(|p| p.id()).collect::<Vec<_>>(),
            "several engines can serve this model and none has a benchmark score; picked by precedence"
        );
        Ok((*chosen).clone())
    }
}
