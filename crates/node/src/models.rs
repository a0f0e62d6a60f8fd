//! The models a node serves: the catalog (every model some plugin can run) and the loaded set.
//!
//! The catalog changes while the node runs (models synced from a router are added and removed):
//! a request holds the `Arc` of the entry it looked up, so replacing or removing an entry never
//! pulls a model from under a request.
//!
//! Models load lazily on first use, once, however many requests ask at the same time. When a
//! load would exceed the memory budget, idle models are unloaded least-recently-used first; a
//! model with requests in flight is never unloaded under them (its engine lives until the last
//! request drops its `Arc`).

use crate::admission::Admission;
use crate::devices::DeviceInventory;
use crate::engine::{load_engine, Engine, EngineIsolation, EngineSettings};
use crate::error::NodeError;
use crate::modality_gate::{modality_of, GateMode, ModalityGate};

mod benchmark;
mod lifecycle;
mod placement;
pub use benchmark::{scores as benchmark_scores, BenchmarkBook};
pub use lifecycle::RestartPolicy;
use llmr_chat_template::{ChatTemplates, SpecialTokens};
use llmr_cluster::EngineReport;
use llmr_engine_host::{Capability, EngineRegistry, ModelRequirements, Plugin, ResolveError};
use llmr_kv_policy::KvPolicy;
use llmr_model_store::{runtime_for, Format, ModelDescriptor};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// A model the node can serve, with the plugin chosen for it.
pub struct CatalogEntry {
    pub desc: ModelDescriptor,
    pub plugin: Arc<Plugin>,
    /// Unix seconds: the file's modification time (the `created` of `/v1/models`).
    pub created: u64,
    /// The loaded copies of the model: one, or one per GPU with `--gpu-replicas` (spec 003),
    /// each with its own engine and KV cache.
    replicas: Mutex<Vec<Arc<LoadedModel>>>,
    /// Round-robin position among the replicas.
    next_replica: AtomicUsize,
    /// Replicas taken out while serving (`retire`): the next load waits until their last
    /// request has finished and they are gone, so the model is never held twice.
    retiring: Mutex<Vec<std::sync::Weak<LoadedModel>>>,
    /// Held while loading, so concurrent first requests wait for one load.
    loading: tokio::sync::Mutex<()>,
}

impl CatalogEntry {
    fn new(desc: ModelDescriptor, plugin: Arc<Plugin>, created: u64) -> Self {
        CatalogEntry {
            desc,
            plugin,
            created,
            replicas: Mutex::default(),
            next_replica: AtomicUsize::new(0),
            retiring: Mutex::default(),
            loading: tokio::sync::Mutex::new(()),
        }
    }

    fn replicas(&self) -> Vec<Arc<LoadedModel>> {
        self.replicas.lock().unwrap().clone()
    }

    fn is_loaded(&self) -> bool {
        !self.replicas.lock().unwrap().is_empty()
    }

    /// The next replica whose engine is alive, round robin; one whose worker ended is skipped
    /// until it is loaded again.
    fn live_replica(&self) -> Option<Arc<LoadedModel>> {
        let live: Vec<Arc<LoadedModel>> =
            self.replicas().into_iter().filter(|m| m.engine.exit_reason().is_none()).collect();
        if live.is_empty() {
            return None;
        }
        let i = self.next_replica.fetch_add(1, Ordering::Relaxed) % live.len();
        Some(live[i].clone())
    }

    /// Takes `replica` out while its requests finish; the next load of the model waits for them.
    fn retire(&self, replica: &Arc<LoadedModel>) -> bool {
        let removed = self.remove_replica(replica);
        if removed {
            self.retiring.lock().unwrap().push(Arc::downgrade(replica));
        }
        removed
    }

    /// Waits until every retired replica is gone (its last request finished).
    async fn retired(&self) {
        loop {
            {
                let mut retiring = self.retiring.lock().unwrap();
                retiring.retain(|w| w.strong_count() > 0);
                if retiring.is_empty() {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Takes `replica` out (unloaded once its requests finish); returns whether it was there.
    fn remove_replica(&self, replica: &Arc<LoadedModel>) -> bool {
        let mut replicas = self.replicas.lock().unwrap();
        let before = replicas.len();
        replicas.retain(|m| !Arc::ptr_eq(m, replica));
        replicas.len() < before
    }
}

pub struct LoadedModel {
    pub name: String,
    pub engine: Box<dyn Engine>,
    /// `None` for embedding-only models.
    pub templates: Option<ChatTemplates>,
    pub admission: Admission,
    /// Bytes the budget counts for this model (the host's, or its GPU's when on one).
    pub footprint: u64,
    /// The GPU it runs on (its ordinal), when the node placed it on one.
    pub device: Option<u32>,
    /// Recent times to the first token (the control API's `ftl_ms` and `p95_ms`).
    pub first_token_times: crate::metrics::RecentTimes,
    engine_id: String,
    /// The plugin's version (its manifest's, which its binary confirmed at load).
    pub engine_version: String,
    last_used: Mutex<Instant>,
    /// When the engine was loaded, and the requests that used it since (periodic restarts).
    pub loaded_at: Instant,
    pub requests: AtomicU64,
    /// The engine evicts middle chunks of a sequence that fills its context (the llama.cpp
    /// plugin under a dynamic KV policy: `kv_eviction` in its metrics), so a request may ask
    /// for more tokens than the context holds. Read at load and after each policy change.
    shifts_context: AtomicBool,
}

impl LoadedModel {
    /// Whether a request may ask for more tokens than the context holds.
    pub fn shifts_context(&self) -> bool {
        self.shifts_context.load(Ordering::Relaxed)
    }

    /// Reads from the engine's metrics whether it evicts middle chunks now.
    fn read_context_shift(&self) {
        let evicts =
            self.engine.metrics().is_some_and(|f| crate::metrics::model_figures(&f)["kv_eviction"].is_object());
        self.shifts_context.store(evicts, Ordering::Relaxed);
    }

    /// Nothing running or queued on it.
    pub fn is_idle(&self) -> bool {
        self.admission.busy() == 0 && self.admission.waiting() == 0
    }

    /// Called once per request that uses the model.
    pub fn touch(&self) {
        *self.last_used.lock().unwrap() = Instant::now();
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Fails unless the model can do what a request needs.
    pub fn require(&self, capability: Capability) -> Result<(), NodeError> {
        if self.engine.info().has(capability) {
            Ok(())
        } else {
            Err(NodeError::Incapable { model: self.name.clone(), needs: capability })
        }
    }

    /// The plugin's engine id (`llama_cpp`, ...), for logs and spans.
    pub fn engine_id(&self) -> &str {
        &self.engine_id
    }
}

#[derive(Debug, Clone)]
pub struct ModelPolicy {
    pub engine: EngineSettings,
    pub queue_limit: usize,
    /// Which models hold the device to one modality at a time (spec 000).
    pub gate_mode: GateMode,
    /// Loaded models together stay under this (bytes of weights plus an allowance for KV).
    pub memory_budget: u64,
    /// Where plugins run: in worker processes (crash isolation) or in the node's process.
    pub isolation: EngineIsolation,
    /// The GPUs models are placed on (spec 003: the one with the most free memory).
    pub devices: DeviceInventory,
    /// Copies of each GPU model, each on a GPU of its own (at most one per GPU); 1: one copy.
    pub replicas: u32,
}

pub struct ModelManager {
    entries: RwLock<BTreeMap<String, Arc<CatalogEntry>>>,
    /// Replaced as a whole when a plugin is reloaded (`switch_plugin`).
    registry: RwLock<Arc<EngineRegistry>>,
    policy: ModelPolicy,
    /// One modality at a time on the device, for the models `policy.gate_mode` names.
    gate: Arc<ModalityGate>,
    /// The KV policy set for the node (`--kv-policy`, `POST /v1/policy`): every model loads
    /// with it, and a change reaches the loaded ones. `None`: each engine's own default.
    kv_policy: RwLock<Option<KvPolicy>>,
    /// Every plugin folder discovery found, loaded or not (what a router's `/v0/engines` shows),
    /// kept up to date when a plugin is reloaded.
    engine_reports: RwLock<Vec<EngineReport>>,
    /// The engine benchmarks of models several plugins can run (`models/benchmark.rs`).
    benchmarks: benchmark::Benchmarks,
    /// GPU memory promised to loads in progress (`models/placement.rs`).
    reserved: placement::Reservations,
    /// Models no plugin could run when they were added: added again when a plugin arrives.
    unsupported: Mutex<BTreeMap<String, ModelDescriptor>>,
    /// Bumped when plugins are added while the node runs (the agent re-syncs what it found
    /// unsupported).
    plugins_added: tokio::sync::watch::Sender<u64>,
}

/// What the node is doing right now (a router's heartbeat carries it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadSnapshot {
    /// Requests running in an engine slot, over all loaded models.
    pub active_requests: usize,
    /// Requests waiting for a slot, over all loaded models.
    pub queue_depth: usize,
    /// Names of the loaded models, sorted.
    pub loaded: Vec<String>,
    /// The memory budget's estimate of what the loaded models hold (weights and KV allowance).
    pub memory_used_bytes: u64,
}

impl ModelManager {
    /// An empty catalog; [`ModelManager::add`] fills it.
    pub fn new(registry: Arc<EngineRegistry>, policy: ModelPolicy) -> Self {
        ModelManager {
            entries: RwLock::new(BTreeMap::new()),
            registry: RwLock::new(registry),
            policy,
            gate: Arc::default(),
            kv_policy: RwLock::new(None),
            engine_reports: RwLock::default(),
            benchmarks: Default::default(),
            reserved: Default::default(),
            unsupported: Mutex::default(),
            plugins_added: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The catalog keeping its engine benchmarks in `book`.
    pub fn with_benchmark_book(mut self, book: BenchmarkBook) -> Self {
        self.benchmarks.book = book;
        self
    }

    /// The catalog with the plugin folders discovery found, for [`Self::engine_reports`].
    pub fn with_engine_reports(self, reports: Vec<EngineReport>) -> Self {
        *self.engine_reports.write().unwrap() = reports;
        self
    }

    /// Every plugin folder the node found, loaded or not, with its manifest.
    pub fn engine_reports(&self) -> Vec<EngineReport> {
        self.engine_reports.read().unwrap().clone()
    }

    /// The KV policy set for the node, if one was.
    pub fn kv_policy(&self) -> Option<KvPolicy> {
        *self.kv_policy.read().unwrap()
    }

    /// Sets the node's KV policy (checked already) and sends it to every loaded model. An
    /// engine that cannot run it (the native engine on CUDA) refuses it, which is logged, and
    /// keeps serving as it was; llama.cpp runs what it can of it (`kv_eviction` in its metrics
    /// says whether that includes middle eviction).
    pub fn set_kv_policy(&self, policy: KvPolicy) {
        let value = serde_json::to_value(policy).expect("a policy serializes");
        *self.kv_policy.write().unwrap() = Some(policy);
        for m in self.loaded() {
            if let Err(e) = m.engine.set_config("kv_policy", &value) {
                tracing::info!(model = %m.name, "KV policy not applied: {}", e.message);
            }
            m.read_context_shift();
        }
    }

    /// The plugins the node runs now.
    pub fn registry(&self) -> Arc<EngineRegistry> {
        self.registry.read().unwrap().clone()
    }

    /// The runtimes of the loaded plugins (`LlamaCpp`, ...), sorted, each once.
    pub fn runtimes(&self) -> Vec<String> {
        let mut all: Vec<String> =
            self.registry().plugins().iter().flat_map(|p| p.manifest.runtimes.iter().cloned()).collect();
        all.sort();
        all.dedup();
        all
    }

    /// The plugin that would run a model of this format and architecture, known before any
    /// file of it is read (a router's manifest says both).
    pub fn engine_for(&self, format: Format, architecture: &str) -> Result<Arc<Plugin>, ResolveError> {
        self.registry().resolve(&ModelRequirements {
            runtime: Some(runtime_for(format, architecture)),
            format: format.as_str(),
            architecture,
            scores: None,
        })
    }

    /// Adds a model to the catalog, or replaces the entry of that name. When no plugin can run
    /// it, fails and leaves no entry of that name. An entry with the very same descriptor is
    /// kept as it is (loaded or not); a replaced entry that was loaded is unloaded once its
    /// requests finish (they hold its engine).
    pub fn add(&self, desc: ModelDescriptor) -> Result<(), ResolveError> {
        let registry = self.registry();
        let req = benchmark::requirements(&desc);
        let candidates = match registry.candidates(&req) {
            Ok(candidates) => candidates,
            Err(e) => {
                self.remove(&desc.name);
                self.unsupported.lock().unwrap().insert(desc.name.clone(), desc);
                return Err(e);
            }
        };
        self.unsupported.lock().unwrap().remove(&desc.name);
        // Several engines can run it: the benchmarks decide, once they exist (spec 000).
        let scores = (candidates.len() > 1).then(|| self.scores_or_queue(&desc, &candidates)).flatten();
        let plugin = registry.resolve(&ModelRequirements { scores: scores.as_ref(), ..req })?;
        let mut entries = self.entries.write().unwrap();
        if entries.get(&desc.name).is_some_and(|e| e.desc == desc && Arc::ptr_eq(&e.plugin, &plugin)) {
            return Ok(());
        }
        let created = std::fs::metadata(&desc.primary_file)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let entry = CatalogEntry::new(desc, plugin, created);
        if let Some(old) = entries.insert(entry.desc.name.clone(), Arc::new(entry)) {
            tracing::info!(model = %old.desc.name, "catalog entry replaced");
        }
        Ok(())
    }

    /// Takes a model out of the catalog: new requests get 404; a loaded model is unloaded once
    /// its requests finish. Its files are not touched. Returns whether it was there.
    pub fn remove(&self, name: &str) -> bool {
        self.unsupported.lock().unwrap().remove(name);
        self.entries.write().unwrap().remove(name).is_some()
    }

    /// Runs `plugins` too (found in the engines folder while the node runs), reporting the
    /// folders as `reports` say: the models no plugin could run are added again, those these
    /// can run too are benchmarked, and the agent is told. Returns the models now served that
    /// were not.
    pub fn add_plugins(&self, plugins: Vec<Arc<Plugin>>, reports: Vec<EngineReport>) -> Vec<String> {
        {
            let mut registry = self.registry.write().unwrap();
            let mut next = (**registry).clone();
            for p in &plugins {
                next = next.with_replaced(p.clone());
            }
            *registry = Arc::new(next);
        }
        {
            let mut known = self.engine_reports.write().unwrap();
            known.retain(|r| !reports.iter().any(|n| n.folder == r.folder));
            known.extend(reports);
        }
        let waiting: Vec<ModelDescriptor> = self.unsupported.lock().unwrap().values().cloned().collect();
        let added = waiting.into_iter().filter_map(|d| self.add(d.clone()).ok().map(|()| d.name)).collect();
        self.queue_stale_benchmarks();
        if !plugins.is_empty() {
            self.plugins_added.send_modify(|n| *n += 1);
        }
        added
    }

    /// Changes each time plugins are added while the node runs.
    pub fn plugins_added(&self) -> tokio::sync::watch::Receiver<u64> {
        self.plugins_added.subscribe()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.read().unwrap().contains_key(name)
    }

    /// The catalog, sorted by name.
    pub fn entries(&self) -> Vec<Arc<CatalogEntry>> {
        self.entries.read().unwrap().values().cloned().collect()
    }

    pub fn entry(&self, name: &str) -> Option<Arc<CatalogEntry>> {
        self.entries.read().unwrap().get(name).cloned()
    }

    /// The loaded models right now, every replica (for metrics and health), sorted by name.
    pub fn loaded(&self) -> Vec<Arc<LoadedModel>> {
        self.entries.read().unwrap().values().flat_map(|e| e.replicas()).collect()
    }

    /// Running and queued requests and memory held, over the loaded models.
    pub fn load(&self) -> LoadSnapshot {
        let mut snapshot = LoadSnapshot::default();
        for m in self.loaded() {
            snapshot.active_requests += m.admission.busy();
            snapshot.queue_depth += m.admission.waiting();
            snapshot.memory_used_bytes += m.footprint;
            snapshot.loaded.push(m.name.clone());
        }
        snapshot.loaded.dedup();
        snapshot
    }

    /// The model (its next live replica), loading it first if needed (again, when its engine
    /// workers ended).
    pub async fn get(&self, name: &str) -> Result<Arc<LoadedModel>, NodeError> {
        let entry = self.entry(name).ok_or_else(|| NodeError::ModelNotFound(name.to_owned()))?;
        if let Some(m) = entry.live_replica() {
            m.touch();
            return Ok(m);
        }
        self.load_entry(&entry).await
    }

    /// Loads `entry`'s model, once however many ask: replicas whose engine ended are dropped
    /// and the missing ones loaded, each on the GPU `place` chooses (at once, in parallel).
    /// Returns a live replica.
    async fn load_entry(&self, entry: &Arc<CatalogEntry>) -> Result<Arc<LoadedModel>, NodeError> {
        let name = entry.desc.name.as_str();
        let _loading = entry.loading.lock().await;
        entry.retired().await;
        entry.replicas.lock().unwrap().retain(|m| m.engine.exit_reason().is_none());
        let have = entry.replicas();
        let taken: Vec<u32> = have.iter().filter_map(|m| m.device).collect();
        let footprint = estimate_footprint(&entry.desc);
        let placements = match self.place(&entry.plugin, name, footprint, have.len(), &taken) {
            Ok(p) => p,
            // Some replicas serve: fewer than asked is not an error.
            Err(e) if !have.is_empty() => {
                tracing::warn!(model = name, "{e}; serving with {} replicas", have.len());
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        if placements.iter().any(Option::is_none) {
            self.make_room(name, footprint)?;
        }
        let loads = placements.into_iter().map(|placement| self.load_replica(entry, footprint, placement));
        let mut first_error = None;
        for loaded in futures_util::future::join_all(loads).await {
            match loaded {
                Ok(m) => entry.replicas.lock().unwrap().push(m),
                Err(e) => {
                    tracing::error!(model = name, "a replica did not load: {e}");
                    first_error.get_or_insert(e);
                }
            }
        }
        match (entry.live_replica(), first_error) {
            (Some(m), _) => {
                m.touch();
                Ok(m)
            }
            (None, Some(e)) => Err(e),
            (None, None) => Err(NodeError::Internal(format!("no replica of '{name}' to load"))),
        }
    }

    /// Loads one copy of `entry`'s model, on `placement`'s GPU when it has one (its memory
    /// reserved until the load ends).
    async fn load_replica(
        &self,
        entry: &Arc<CatalogEntry>,
        footprint: u64,
        placement: Option<placement::Placement>,
    ) -> Result<Arc<LoadedModel>, NodeError> {
        let name = entry.desc.name.as_str();
        let plugin = entry.plugin.clone();
        let desc = entry.desc.clone();
        let mut settings = self.policy.engine.clone();
        if let Some(policy) = self.kv_policy() {
            settings.load_options = Some(serde_json::json!({ "kv_policy": policy }));
        }
        let device = placement.as_ref().map(|p| p.device.index);
        settings.device = placement.as_ref().map(|p| p.device.clone());
        let started = Instant::now();
        let isolation = self.policy.isolation.clone();
        let engine = tokio::task::spawn_blocking(move || load_engine(&isolation, &plugin, &desc, &settings))
            .await
            .map_err(|e| NodeError::Internal(format!("model load panicked: {e}")))?
            .map_err(|error| NodeError::LoadFailed { model: name.to_owned(), error })?;
        drop(placement);
        let info = engine.info().clone();
        let templates = if info.has(Capability::Text) {
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
            device = ?device,
            "model loaded"
        );
        let mut admission = Admission::new(info.slots.unwrap_or(1), self.policy.queue_limit);
        let backend = entry.plugin.manifest.gpu_backends[0];
        if self.policy.gate_mode.applies_to(backend) {
            admission = admission.gated(self.gate.clone(), modality_of(&info));
        }
        let loaded = Arc::new(LoadedModel {
            name: name.to_owned(),
            admission,
            engine_id: entry.plugin.id().to_owned(),
            engine_version: entry.plugin.manifest.version.to_string(),
            engine,
            templates,
            footprint,
            device,
            first_token_times: Default::default(),
            last_used: Mutex::new(Instant::now()),
            loaded_at: Instant::now(),
            requests: AtomicU64::new(0),
            shifts_context: AtomicBool::new(false),
        });
        loaded.read_context_shift();
        metrics::counter!(crate::metrics::MODEL_LOADS, "model" => name.to_owned()).increment(1);
        Ok(loaded)
    }

    /// Unloads idle models, least recently used first, until `needed` more bytes fit in the
    /// host's budget (models on a GPU count against their GPU, `models/placement.rs`).
    fn make_room(&self, loading: &str, needed: u64) -> Result<(), NodeError> {
        loop {
            let mut used = 0u64;
            let mut victim: Option<(Arc<CatalogEntry>, Arc<LoadedModel>, Instant)> = None;
            for entry in self.entries() {
                if entry.desc.name == loading {
                    continue;
                }
                // A model being loaded right now by another request counts once it is in.
                for m in entry.replicas().into_iter().filter(|m| m.device.is_none()) {
                    used += m.footprint;
                    // Idle: nothing running or queued. (A request between lookup and admission keeps the
                    // engine alive through its Arc; the memory is returned when it finishes.)
                    let last = *m.last_used.lock().unwrap();
                    if m.is_idle() && victim.as_ref().is_none_or(|(_, _, t)| last < *t) {
                        victim = Some((entry.clone(), m, last));
                    }
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
            let Some((entry, replica, _)) = victim else {
                return Err(NodeError::NoMemory {
                    model: loading.to_owned(),
                    budget_mib: self.policy.memory_budget >> 20,
                    held_mib: used >> 20,
                });
            };
            if entry.remove_replica(&replica) {
                tracing::info!(model = %replica.name, "unloading (least recently used) to make room for {loading}");
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
