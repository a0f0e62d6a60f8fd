//! The models a node serves: the catalog (every model some plugin can run) and the loaded set.
//!
//! Models load lazily on first use, once, however many requests ask at the same time. When a
//! load would exceed the memory budget, idle models are unloaded least-recently-used first; a
//! model with requests in flight is never unloaded under them (its engine lives until the last
//! request drops its `Arc`).

use crate::admission::Admission;
use crate::engine::{Engine, EngineSettings, PluginEngine};
use llmr_chat_template::{ChatTemplates, SpecialTokens};
use llmr_engine_host::{EngineRegistry, ModelRequirements, Plugin};
use llmr_model_store::ModelDescriptor;
use llmr_openai::ApiError;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A model the node can serve, with the plugin chosen for it.
pub struct CatalogEntry {
    pub desc: ModelDescriptor,
    pub plugin: Arc<Plugin>,
    /// Unix seconds: the file's modification time (the `created` of `/v1/models`).
    pub created: u64,
    loaded: Mutex<Option<Arc<LoadedModel>>>,
    /// Held while loading, so concurrent first requests wait for one load.
    loading: tokio::sync::Mutex<()>,
}

impl CatalogEntry {
    fn current(&self) -> Option<Arc<LoadedModel>> {
        self.loaded.lock().unwrap().clone()
    }
}

pub struct LoadedModel {
    pub name: String,
    pub engine: Box<dyn Engine>,
    /// `None` for embedding-only models.
    pub templates: Option<ChatTemplates>,
    pub admission: Admission,
    /// Bytes the budget counts for this model.
    pub footprint: u64,
    last_used: Mutex<Instant>,
}

impl LoadedModel {
    pub fn touch(&self) {
        *self.last_used.lock().unwrap() = Instant::now();
    }
}

#[derive(Debug, Clone)]
pub struct ModelPolicy {
    pub engine: EngineSettings,
    pub queue_limit: usize,
    /// Loaded models together stay under this (bytes of weights plus an allowance for KV).
    pub memory_budget: u64,
}

pub struct ModelManager {
    entries: BTreeMap<String, CatalogEntry>,
    policy: ModelPolicy,
}

/// Models whose architecture no plugin supports are left out (and logged), so `/v1/models`
/// lists only what can answer.
pub fn build_catalog(models: Vec<ModelDescriptor>, registry: &EngineRegistry) -> BTreeMap<String, CatalogEntry> {
    let mut entries = BTreeMap::new();
    for desc in models {
        let req = ModelRequirements {
            runtime: Some(&desc.runtime),
            format: desc.format.as_str(),
            architecture: &desc.architecture,
            scores: None,
        };
        match registry.resolve(&req) {
            Ok(plugin) => {
                let created = std::fs::metadata(&desc.primary_file)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs());
                if entries.contains_key(&desc.name) {
                    tracing::warn!(model = %desc.name, "two models share this name; serving the first");
                    continue;
                }
                entries.insert(
                    desc.name.clone(),
                    CatalogEntry {
                        desc,
                        plugin,
                        created,
                        loaded: Mutex::new(None),
                        loading: tokio::sync::Mutex::new(()),
                    },
                );
            }
            Err(e) => tracing::warn!(model = %desc.name, "not served: {e}"),
        }
    }
    entries
}

impl ModelManager {
    pub fn new(entries: BTreeMap<String, CatalogEntry>, policy: ModelPolicy) -> Self {
        ModelManager { entries, policy }
    }

    pub fn entries(&self) -> impl Iterator<Item = &CatalogEntry> {
        self.entries.values()
    }

    pub fn entry(&self, name: &str) -> Option<&CatalogEntry> {
        self.entries.get(name)
    }

    /// The loaded models right now (for metrics and health).
    pub fn loaded(&self) -> Vec<Arc<LoadedModel>> {
        self.entries.values().filter_map(CatalogEntry::current).collect()
    }

    /// The model, loading it first if needed.
    pub async fn get(&self, name: &str) -> Result<Arc<LoadedModel>, ApiError> {
        let entry = self.entries.get(name).ok_or_else(|| ApiError::model_not_found(name))?;
        if let Some(m) = entry.current() {
            m.touch();
            return Ok(m);
        }
        let _loading = entry.loading.lock().await;
        if let Some(m) = entry.current() {
            m.touch();
            return Ok(m);
        }
        let footprint = estimate_footprint(&entry.desc);
        self.make_room(name, footprint)?;
        let plugin = entry.plugin.clone();
        let desc = entry.desc.clone();
        let settings = self.policy.engine.clone();
        let started = Instant::now();
        let engine = tokio::task::spawn_blocking(move || PluginEngine::load(&plugin, &desc, &settings))
            .await
            .map_err(|e| ApiError::server(format!("model load panicked: {e}")))?
            .map_err(|e| {
                ApiError::with_status(e.status.http_status(), format!("loading model `{name}` failed: {}", e.message))
                    .with_code(e.status.code())
            })?;
        let info = engine.info().clone();
        let templates = if info.text {
            let tokens = SpecialTokens { bos_token: info.bos_token.clone(), eos_token: info.eos_token.clone() };
            match ChatTemplates::from_sources(info.chat_template.as_deref(), None, tokens.clone()) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(model = name, "chat template does not compile ({e}); using ChatML");
                    Some(ChatTemplates::from_sources(None, None, tokens).expect("ChatML compiles"))
                }
            }
        } else {
            None
        };
        tracing::info!(
            model = name,
            ms = started.elapsed().as_millis() as u64,
            ctx = info.context_length,
            "model loaded"
        );
        let loaded = Arc::new(LoadedModel {
            name: name.to_owned(),
            admission: Admission::new(info.slots, self.policy.queue_limit),
            engine: Box::new(engine),
            templates,
            footprint,
            last_used: Mutex::new(Instant::now()),
        });
        metrics::counter!(crate::metrics::MODEL_LOADS, "model" => name.to_owned()).increment(1);
        *entry.loaded.lock().unwrap() = Some(loaded.clone());
        Ok(loaded)
    }

    /// Unloads idle models, least recently used first, until `needed` more bytes fit.
    fn make_room(&self, loading: &str, needed: u64) -> Result<(), ApiError> {
        loop {
            let mut used = 0u64;
            let mut victim: Option<(&CatalogEntry, Instant)> = None;
            for (name, entry) in &self.entries {
                if name == loading {
                    continue;
                }
                // A model being loaded right now by another request counts once it is in.
                let Some(m) = entry.current() else { continue };
                used += m.footprint;
                // Idle: nothing running or queued. (A request between lookup and admission keeps the
                // engine alive through its Arc; the memory is returned when it finishes.)
                let idle = m.admission.busy() == 0 && m.admission.waiting() == 0;
                let last = *m.last_used.lock().unwrap();
                if idle && victim.is_none_or(|(_, t)| last < t) {
                    victim = Some((entry, last));
                }
            }
            if used + needed <= self.policy.memory_budget || used == 0 {
                if used + needed > self.policy.memory_budget {
                    tracing::warn!(
                        model = loading,
                        needed,
                        budget = self.policy.memory_budget,
                        "model is larger than the memory budget; loading it anyway"
                    );
                }
                return Ok(());
            }
            let Some((entry, _)) = victim else {
                return Err(ApiError::unavailable(format!(
                    "not enough memory to load `{loading}` now: the budget is {} MiB, {} MiB are held by models serving requests",
                    self.policy.memory_budget >> 20,
                    used >> 20
                )));
            };
            if let Some(m) = entry.loaded.lock().unwrap().take() {
                tracing::info!(model = %m.name, "unloading (least recently used) to make room for {loading}");
            }
        }
    }
}

/// Weights plus a KV allowance. The engine decides its context; a quarter of the weights with a
/// 64 MiB floor covers the default contexts of small and mid-size models without reading them.
fn estimate_footprint(desc: &ModelDescriptor) -> u64 {
    desc.size_bytes + (desc.size_bytes / 4).max(64 << 20)
}

/// Bytes of RAM on this machine (Linux `/proc/meminfo`); `None` where it cannot be read.
pub fn total_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
