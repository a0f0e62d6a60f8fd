//! Building a node from its configuration, and serving it.

use crate::cache::GenerationCache;
use crate::control::{self, ControlState, SharedControl};
use crate::devices::DeviceInventory;
use crate::engine::{EngineIsolation, EngineSettings};
use crate::http::{self, AppState, SharedState};
use crate::memory_guard::{MemoryGuard, MemoryProbe};
use crate::modality_gate::GateMode;
use crate::models::{total_memory_bytes, BenchmarkBook, ModelManager, ModelPolicy, RestartPolicy};
use crate::plugin_reload::PluginWatcher;
use anyhow::{bail, Result};
use llmr_engine_host::{discover_vetted, DiscoveryOptions, EngineRegistry, PluginState};
use llmr_model_store::ModelDescriptor;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub engines_dir: PathBuf,
    /// The models to serve (from the store and from files named on the command line).
    pub models: Vec<ModelDescriptor>,
    /// Requests each model runs at once (engine slots).
    pub slots: u32,
    /// Requests that may wait for a slot, per model, before 429.
    pub queue_limit: usize,
    /// Which models hold the device to one modality at a time, refusing the others with 429
    /// (spec 000); by default those on a GPU.
    pub gpu_modality_gate: GateMode,
    /// 0: the engine's default.
    pub threads: u32,
    /// Per-request context; 0: the engine's default.
    pub context_length: u32,
    /// `None`: 90% of RAM (spec).
    pub memory_budget: Option<u64>,
    /// Temperature-0 answer cache; `None`: 5% of RAM (spec 003); `Some(0)`: off.
    pub cache_bytes: Option<usize>,
    /// `/v1` requires `Authorization: Bearer KEY` (or `x-api-key`) with one of these; none: open.
    /// (Under a router: the router's per-start secret, and the user's key if any.)
    pub api_keys: Vec<String>,
    pub body_limit: usize,
    /// The control API (spec 002) on 127.0.0.1 at this port; `None`: off.
    pub control_port: Option<u16>,
    /// One JSON line of the control API's metrics a second, appended here; `None`: off.
    pub metrics_file: Option<PathBuf>,
    /// The KV policy every model starts with (a patch on the baseline, checked at start).
    pub kv_policy: Option<serde_json::Value>,
    /// Where plugins run. `llmr` runs each model in a worker process (crash isolation); the
    /// library's default is the node's own process, which needs no worker binary.
    pub engine_isolation: EngineIsolation,
    /// Where the memory guard reads memory in use (past 90% it unloads idle models); by
    /// default this machine's RAM.
    pub memory_probe: MemoryProbe,
    /// Loaded models are restarted in a new engine after this long or this many requests
    /// (spec 003; the shadow way, no request dropped); by default never.
    pub engine_restart: RestartPolicy,
    /// Where the node keeps its engine benchmarks (models several plugins can run are measured
    /// with each, spec 000); `None`: in memory only, measured again at each start.
    pub benchmarks_file: Option<PathBuf>,
    /// The GPUs models are placed on (the one with the most free memory, spec 003) and the
    /// backend plugins must be built for; by default this machine's.
    pub devices: DeviceInventory,
    /// Copies of each GPU model, each on its own GPU, taking requests in turn (spec 003's
    /// replicas); 1: one copy.
    pub gpu_replicas: u32,
    pub audio: AudioLimits,
}

/// Bounds on the speech endpoints' inputs (each refused with 413 naming its field).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AudioLimits {
    /// An uploaded audio file, in bytes (OpenAI's limit: 25 MiB).
    pub max_upload_bytes: usize,
    /// Seconds of audio in one upload, checked while decoding.
    pub max_seconds: f64,
    /// Characters of text to speak in one request (OpenAI's limit: 4096).
    pub max_speech_chars: usize,
}

impl Default for AudioLimits {
    fn default() -> Self {
        AudioLimits {
            max_upload_bytes: llmr_openai::audio::DEFAULT_MAX_AUDIO_BYTES,
            max_seconds: 3600.0,
            max_speech_chars: llmr_openai::audio::MAX_SPEECH_INPUT_CHARS,
        }
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            engines_dir: PathBuf::from("engines"),
            models: Vec::new(),
            slots: 4,
            queue_limit: 64,
            gpu_modality_gate: GateMode::Auto,
            threads: 0,
            context_length: 0,
            memory_budget: None,
            cache_bytes: None,
            api_keys: Vec::new(),
            body_limit: 16 << 20,
            control_port: None,
            metrics_file: None,
            kv_policy: None,
            engine_isolation: EngineIsolation::InProcess,
            memory_probe: MemoryProbe::host(),
            engine_restart: RestartPolicy::default(),
            benchmarks_file: None,
            devices: DeviceInventory::host(),
            gpu_replicas: 1,
            audio: AudioLimits::default(),
        }
    }
}

pub struct Node {
    state: SharedState,
    /// Where plugins were found, and how (new folders are looked for while serving).
    engines_dir: PathBuf,
    discovery: DiscoveryOptions,
    isolation: EngineIsolation,
    memory_probe: MemoryProbe,
    engine_restart: RestartPolicy,
    control: SharedControl,
    control_port: Option<u16>,
    metrics_file: Option<PathBuf>,
}

impl Node {
    /// Discovers the engine plugins and builds the catalog; loads nothing yet.
    pub fn new(config: NodeConfig) -> Result<Node> {
        let gpu = config.devices.backend;
        let mut registry = EngineRegistry::new();
        let discovery = DiscoveryOptions { gpu, allow_cpu: true };
        let vet = |dir: &std::path::Path| crate::engine::vet_plugin(&config.engine_isolation, dir);
        let found = discover_vetted(&config.engines_dir, &discovery, &mut registry, &vet);
        for f in &found {
            if let PluginState::Refused(reason) = &f.state {
                tracing::warn!(dir = %f.dir.display(), "engine plugin refused: {reason}");
            }
        }
        if registry.plugins().is_empty() {
            bail!(
                "no engine plugin loaded from {} (build and install them with scripts/install-engines; `llmr engines list` says why a plugin was refused)",
                config.engines_dir.display()
            );
        }
        let ram = total_memory_bytes().unwrap_or(8 << 30);
        let policy = ModelPolicy {
            engine: EngineSettings {
                slots: config.slots,
                threads: config.threads,
                context_length: config.context_length,
                host_memory_total_bytes: ram,
                load_options: None,
                device: None,
            },
            queue_limit: config.queue_limit,
            gate_mode: config.gpu_modality_gate,
            memory_budget: config.memory_budget.unwrap_or(ram / 10 * 9),
            isolation: config.engine_isolation.clone(),
            devices: config.devices.clone(),
            replicas: config.gpu_replicas.max(1),
        };
        let models = ModelManager::new(Arc::new(registry), policy)
            .with_engine_reports(crate::agent::engines::engine_reports(&found))
            .with_benchmark_book(BenchmarkBook::open(config.benchmarks_file.clone()));
        if let Some(patch) = &config.kv_policy {
            let policy = llmr_kv_policy::KvPolicy::baseline().patched_json(patch)?;
            models.set_kv_policy(policy);
        }
        // Models whose architecture no plugin supports are left out (and logged), so
        // `/v1/models` lists only what can answer.
        for desc in config.models.iter().cloned() {
            if models.contains(&desc.name) {
                tracing::warn!(model = %desc.name, "two models share this name; serving the first");
                continue;
            }
            let name = desc.name.clone();
            if let Err(e) = models.add(desc) {
                tracing::warn!(model = %name, "not served: {e}");
            }
        }
        let cache_bytes = config.cache_bytes.unwrap_or((ram / 20) as usize);
        let state = Arc::new(AppState {
            models: Arc::new(models),
            cache: Arc::new(GenerationCache::new(cache_bytes)),
            api_keys: config.api_keys.iter().filter(|k| !k.is_empty()).cloned().collect(),
            body_limit: config.body_limit,
            audio: config.audio,
            fingerprint: format!("llmr-{}", env!("CARGO_PKG_VERSION")),
        });
        crate::metrics::handle();
        let control = ControlState::new(state.models.clone());
        Ok(Node {
            state,
            engines_dir: config.engines_dir.clone(),
            discovery,
            isolation: config.engine_isolation.clone(),
            memory_probe: config.memory_probe,
            engine_restart: config.engine_restart,
            control,
            control_port: config.control_port,
            metrics_file: config.metrics_file,
        })
    }

    /// The control API (spec 002), for a loopback listener of its own.
    pub fn control_router(&self) -> axum::Router {
        control::router(self.control.clone())
    }

    pub fn models(&self) -> &Arc<ModelManager> {
        &self.state.models
    }

    pub fn router(&self) -> axum::Router {
        http::router(self.state.clone())
    }

    /// Loads a model in the background, so the first request finds it ready (or waits for the
    /// same load instead of starting another).
    pub fn preload(&self, name: &str) {
        let models = self.state.models.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            if let Err(e) = models.get(&name).await {
                tracing::error!(model = %name, "preloading failed: {e}");
            }
        });
    }

    /// Starts a generation on `model` outside HTTP (`llmr run`), through the same answer cache
    /// and admission as a request.
    pub async fn generate(
        &self,
        model: &std::sync::Arc<crate::models::LoadedModel>,
        input: crate::generation::GenerationInput,
    ) -> Result<crate::generation::Generation, crate::NodeError> {
        crate::generation::begin(model, &self.state.cache, input).await
    }

    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        if let Some(path) = self.metrics_file.clone() {
            control::spawn_metrics_file(self.control.clone(), path);
        }
        // The control listener lives as long as the main one.
        let control = match self.control_port {
            Some(port) => {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("the control API cannot listen on {addr}: {e}"))?;
                tracing::info!(%addr, "control API listening (loopback only)");
                crate::slow_loop::spawn(self.control.clone());
                let router = self.control_router();
                Some(tokio::spawn(async move { axum::serve(listener, router).await }))
            }
            None => None,
        };
        let guard = MemoryGuard::new(self.memory_probe.clone());
        let plugins = PluginWatcher::new(self.engines_dir.clone(), self.discovery, self.isolation.clone());
        let supervisor = tokio::spawn(supervise(self.state.models.clone(), guard, self.engine_restart, plugins));
        let benchmarks = tokio::spawn(self.state.models.clone().run_benchmarks());
        let served = axum::serve(listener, self.router()).with_graceful_shutdown(shutdown).await;
        supervisor.abort();
        benchmarks.abort();
        if let Some(c) = control {
            c.abort();
        }
        served?;
        Ok(())
    }
}

/// How often the memory guard reads the GPUs' memory.
const DEVICE_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// How often the supervisor looks for engine workers that ended.
const SUPERVISOR_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// The supervisor: a model whose engine worker ended (crash, hang) is reloaded in a new one at
/// once, not when its next request comes; the memory guard unloads idle models when memory runs
/// short; a plugin whose folder holds a new version is reloaded (`plugin_reload.rs`); and models
/// due for their periodic restart get a new engine.
async fn supervise(
    models: Arc<ModelManager>,
    mut guard: MemoryGuard,
    restart: RestartPolicy,
    mut plugins: PluginWatcher,
) {
    let mut tick = tokio::time::interval(SUPERVISOR_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut devices_read = std::time::Instant::now();
    loop {
        tick.tick().await;
        models.restart_ended().await;
        guard.check(&models);
        // GPUs are read less often: `nvidia-smi` takes tens of milliseconds.
        if models.devices().has_devices() && devices_read.elapsed() >= DEVICE_POLL {
            devices_read = std::time::Instant::now();
            let inventory = models.devices().clone();
            if let Ok(devices) = tokio::task::spawn_blocking(move || inventory.devices()).await {
                guard.check_devices(&models, &devices);
            }
        }
        plugins.check(&models).await;
        models.restart_aged(&restart).await;
    }
}
