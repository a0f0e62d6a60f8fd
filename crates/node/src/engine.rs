//! The one `Engine` trait the node serves through, and its two implementations over a plugin:
//! in a worker process of its own (`IsolatedEngine`, the default of `llmr`) or in the node's
//! process (`PluginEngine`).
//!
//! One `Engine` is one loaded model. The node never touches the C ABI: `PluginEngine` owns an
//! `EngineInstance` (which owns the `unsafe`) and `IsolatedEngine` a `WorkerEngine` (a process
//! that owns one), so another kind of engine would only implement this trait.

use llmr_engine_host::{
    abi, CallError, Capability, EmbedInputs, EngineInstance, InferParams, InferResult, InstanceConfig, ModelInfo,
    ModelSpec, Plugin, Segment, SynthesizeParams, TokenEvent, TranscribeParams,
};
use llmr_engine_worker::{WorkerCommand, WorkerEngine};
use llmr_model_store::ModelDescriptor;
use std::sync::Arc;
use std::time::Duration;

pub trait Engine: Send + Sync {
    /// What the engine reported at load, with the node's defaults filled in: `slots` and
    /// `architecture` are always set.
    fn info(&self) -> &ModelInfo;
    fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<i32>, CallError>;
    /// Blocks until the generation ends; `on_token` returning false cancels it.
    fn generate(
        &self,
        params: &InferParams<'_>,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<InferResult, CallError>;
    /// Blocks; returns the number of prompt tokens.
    fn embed(
        &self,
        request_id: u64,
        inputs: EmbedInputs<'_>,
        normalize: bool,
        on_embedding: &mut dyn FnMut(usize, &[f32]) -> bool,
    ) -> Result<u32, CallError>;
    /// Blocks until the audio is transcribed; `on_segment` returning false cancels it.
    fn transcribe(
        &self,
        params: &TranscribeParams<'_>,
        on_segment: &mut dyn FnMut(Segment) -> bool,
    ) -> Result<(), CallError>;
    /// Blocks until the text is spoken; `on_audio(samples, rate)` returning false cancels it.
    fn synthesize(
        &self,
        params: &SynthesizeParams<'_>,
        on_audio: &mut dyn FnMut(&[f32], u32) -> bool,
    ) -> Result<(), CallError>;
    /// Stops request `request_id` wherever it is (queued, prefill or decode).
    fn cancel(&self, request_id: u64);
    /// The engine's own counters (KV usage, slots), as JSON.
    fn metrics(&self) -> Option<serde_json::Value>;
    /// Changes one of the engine's settings for this model at run time (`kv_policy`, ...).
    fn set_config(&self, key: &str, value: &serde_json::Value) -> Result<(), CallError>;
    /// Whether the engine decodes under a constraint (`Sampling::constraint`).
    fn constrains(&self) -> bool;
    /// Whether the engine writes generated control tokens as their text when asked
    /// (`InferParams::special_text`), as harmony answers need.
    fn writes_special(&self) -> bool;
    /// Why the engine can no longer serve (its worker process crashed, or hung and was ended),
    /// once that happened; every call then fails. An engine in the node's process never ends
    /// on its own (a crash there ends the node).
    fn exit_reason(&self) -> Option<String> {
        None
    }
    /// The most memory the engine has held, where it can be told apart from the node's (its
    /// worker's peak resident set).
    fn peak_memory_bytes(&self) -> Option<u64> {
        None
    }
    /// The memory the engine holds now, where it can be told apart from the node's (its
    /// worker's resident set).
    fn resident_bytes(&self) -> Option<u64> {
        None
    }
}

/// Where plugins run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineIsolation {
    /// In the node's own process: a plugin crash ends the node.
    InProcess,
    /// Each loaded model in a worker process started with `command`: a crash or hang ends only
    /// that worker, and the node reloads the model in a new one.
    Worker {
        command: WorkerCommand,
        /// An engine call with no progress (no token, segment or audio, and no change in the
        /// engine's work counters) for this long is a hang: its worker is ended and its
        /// requests fail with 504. A load is watched by time alone (`load_time_limit`). `None`:
        /// no watchdog.
        watchdog: Option<Duration>,
    },
}

/// How long opening a plugin in a probe process may take (a GPU library's initialisers can take
/// seconds).
const PROBE_LIMIT: Duration = Duration::from_secs(60);

/// Whether the plugin folder `dir` may be opened in the node's process. With engines in workers,
/// it is first opened in a worker of its own that then exits (`llmr_engine_worker::probe`), so
/// a library whose initialisers crash ends only that process and is refused, naming how.
pub fn vet_plugin(isolation: &EngineIsolation, dir: &std::path::Path) -> Result<(), String> {
    match isolation {
        EngineIsolation::InProcess => Ok(()),
        EngineIsolation::Worker { command, .. } => {
            llmr_engine_worker::probe(command, dir, PROBE_LIMIT).map(|_| ()).map_err(|e| e.message)
        }
    }
}

/// The spec's watchdog time (spec 000: 30 s).
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(30);

/// How long a model's load may take before it counts as hung (where the watchdog is on): a load
/// reports no progress, and a big model on a slow disk legitimately takes minutes, so 5 minutes
/// and a minute per GiB of files (a disk slower than 17 MB/s).
pub fn load_time_limit(size_bytes: u64) -> Duration {
    Duration::from_secs(300 + 60 * size_bytes.div_ceil(1 << 30))
}

/// Settings the node passes to every engine instance it creates.
#[derive(Debug, Clone, Default)]
pub struct EngineSettings {
    pub slots: u32,
    pub threads: u32,
    /// 0: the engine's default.
    pub context_length: u32,
    pub host_memory_total_bytes: u64,
    /// The model's load options (a JSON object: the KV policy the node runs, ...).
    pub load_options: Option<serde_json::Value>,
    /// The GPU the instance runs on, when the node placed the model on one.
    pub device: Option<crate::devices::Device>,
}

pub struct PluginEngine {
    instance: EngineInstance,
    model_id: String,
    info: ModelInfo,
}

/// The model as the ABI describes it: the one conversion from the store's descriptor.
fn model_spec(desc: &ModelDescriptor, settings: &EngineSettings) -> ModelSpec {
    ModelSpec {
        model_dir: desc.model_dir.display().to_string(),
        architecture: Some(desc.architecture.clone()),
        quantization: desc.quantization.clone(),
        mmproj_file: desc.mmproj.as_ref().map(|p| p.display().to_string()),
        context_length: settings.context_length,
        options: settings.load_options.clone(),
        ..ModelSpec::new(desc.name.clone(), desc.format, desc.primary_file.display().to_string())
    }
}

fn instance_config(settings: &EngineSettings) -> InstanceConfig {
    InstanceConfig {
        slots: settings.slots,
        threads: settings.threads,
        context_length: settings.context_length,
        host_memory_total_bytes: settings.host_memory_total_bytes,
        device_id: settings.device.as_ref().map(|d| d.index as i32),
        device_name: settings.device.as_ref().map(|d| d.name.clone()),
        device_memory_total_bytes: settings.device.as_ref().map_or(0, |d| d.memory_total_bytes),
        device_memory_free_bytes: settings.device.as_ref().map_or(0, |d| d.memory_free_bytes),
        ..Default::default()
    }
}

/// What the engine reported, with the node's defaults filled in.
fn completed_info(
    mut info: ModelInfo,
    plugin: &Plugin,
    desc: &ModelDescriptor,
    settings: &EngineSettings,
) -> ModelInfo {
    // An engine that does not say what this model serves (every key of `model_info` is optional:
    // the C template reports none) serves what its manifest declares.
    if info.capabilities.is_empty() {
        info.capabilities = plugin.manifest.modalities.iter().filter_map(|m| Capability::parse(m)).collect();
    }
    // An engine that does not say how many requests it runs at once runs what it was asked to.
    info.slots = Some(info.slots.filter(|&n| n > 0).unwrap_or(settings.slots.max(1)));
    info.architecture = Some(desc.architecture.clone());
    info
}

/// Loads `desc` with `plugin` where `isolation` says (blocking; seconds for big models).
pub fn load_engine(
    isolation: &EngineIsolation,
    plugin: &Arc<Plugin>,
    desc: &ModelDescriptor,
    settings: &EngineSettings,
) -> Result<Box<dyn Engine>, CallError> {
    Ok(match isolation {
        EngineIsolation::InProcess => Box::new(PluginEngine::load(plugin, desc, settings)?),
        EngineIsolation::Worker { command, watchdog } => {
            Box::new(IsolatedEngine::load(command, *watchdog, plugin, desc, settings)?)
        }
    })
}

impl PluginEngine {
    /// Creates an instance of `plugin` and loads the model into it (blocking; seconds for big models).
    pub fn load(plugin: &Arc<Plugin>, desc: &ModelDescriptor, settings: &EngineSettings) -> Result<Self, CallError> {
        let instance = EngineInstance::create(plugin, &instance_config(settings))?;
        instance.load_model(&model_spec(desc, settings))?;
        let info = completed_info(instance.model_info(&desc.name)?, plugin, desc, settings);
        Ok(PluginEngine { instance, model_id: desc.name.clone(), info })
    }
}

impl Engine for PluginEngine {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn constrains(&self) -> bool {
        self.instance.plugin().info.capabilities & abi::LLMR_CAP_CONSTRAINED != 0
    }

    fn writes_special(&self) -> bool {
        self.instance.plugin().info.capabilities & abi::LLMR_CAP_SPECIAL_TEXT != 0
    }

    fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<i32>, CallError> {
        self.instance.tokenize(&self.model_id, text, add_bos, parse_special)
    }

    fn generate(
        &self,
        params: &InferParams<'_>,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<InferResult, CallError> {
        self.instance.infer(params, on_token)
    }

    fn embed(
        &self,
        request_id: u64,
        inputs: EmbedInputs<'_>,
        normalize: bool,
        on_embedding: &mut dyn FnMut(usize, &[f32]) -> bool,
    ) -> Result<u32, CallError> {
        self.instance.embed_inputs(request_id, &self.model_id, inputs, normalize, on_embedding)
    }

    fn transcribe(
        &self,
        params: &TranscribeParams<'_>,
        on_segment: &mut dyn FnMut(Segment) -> bool,
    ) -> Result<(), CallError> {
        self.instance.transcribe(&TranscribeParams { model_id: &self.model_id, ..params.clone() }, on_segment)
    }

    fn synthesize(
        &self,
        params: &SynthesizeParams<'_>,
        on_audio: &mut dyn FnMut(&[f32], u32) -> bool,
    ) -> Result<(), CallError> {
        self.instance.synthesize(&SynthesizeParams { model_id: &self.model_id, ..params.clone() }, on_audio)
    }

    fn cancel(&self, request_id: u64) {
        // Unknown ids are fine: the request may have just finished.
        let _ = self.instance.cancel(request_id);
    }

    fn metrics(&self) -> Option<serde_json::Value> {
        self.instance.metrics().ok()
    }

    fn set_config(&self, key: &str, value: &serde_json::Value) -> Result<(), CallError> {
        self.instance.set_config(Some(&self.model_id), key, value)
    }
}

impl Drop for PluginEngine {
    fn drop(&mut self) {
        if let Err(e) = self.instance.unload_model(&self.model_id) {
            tracing::warn!(model = %self.model_id, "unload failed: {}", e.message);
        }
    }
}

/// One model in an engine worker process of its own.
pub struct IsolatedEngine {
    worker: WorkerEngine,
    info: ModelInfo,
}

impl IsolatedEngine {
    /// Starts a worker that opens `plugin`'s folder and loads the model (blocking).
    pub fn load(
        command: &WorkerCommand,
        watchdog: Option<Duration>,
        plugin: &Arc<Plugin>,
        desc: &ModelDescriptor,
        settings: &EngineSettings,
    ) -> Result<Self, CallError> {
        let spec = model_spec(desc, settings);
        let load_timeout = watchdog.map(|_| load_time_limit(desc.size_bytes));
        let worker =
            WorkerEngine::spawn(command, &plugin.dir, &instance_config(settings), &spec, watchdog, load_timeout)?;
        if worker.version() != plugin.info.version {
            // The files changed since the node read them: what runs is what the worker loaded.
            tracing::warn!(
                model = %desc.name,
                "engine '{}' is {} in the worker but {} in the node",
                plugin.id(),
                worker.version(),
                plugin.info.version
            );
        }
        let info = completed_info(worker.info().clone(), plugin, desc, settings);
        Ok(IsolatedEngine { worker, info })
    }
}

impl Engine for IsolatedEngine {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn constrains(&self) -> bool {
        self.worker.capabilities() & abi::LLMR_CAP_CONSTRAINED != 0
    }

    fn writes_special(&self) -> bool {
        self.worker.capabilities() & abi::LLMR_CAP_SPECIAL_TEXT != 0
    }

    fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<i32>, CallError> {
        self.worker.tokenize(text, add_bos, parse_special)
    }

    fn generate(
        &self,
        params: &InferParams<'_>,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<InferResult, CallError> {
        self.worker.infer(params, on_token)
    }

    fn embed(
        &self,
        request_id: u64,
        inputs: EmbedInputs<'_>,
        normalize: bool,
        on_embedding: &mut dyn FnMut(usize, &[f32]) -> bool,
    ) -> Result<u32, CallError> {
        self.worker.embed(request_id, inputs, normalize, on_embedding)
    }

    fn transcribe(
        &self,
        params: &TranscribeParams<'_>,
        on_segment: &mut dyn FnMut(Segment) -> bool,
    ) -> Result<(), CallError> {
        self.worker.transcribe(params, on_segment)
    }

    fn synthesize(
        &self,
        params: &SynthesizeParams<'_>,
        on_audio: &mut dyn FnMut(&[f32], u32) -> bool,
    ) -> Result<(), CallError> {
        self.worker.synthesize(params, on_audio)
    }

    fn cancel(&self, request_id: u64) {
        self.worker.cancel(request_id);
    }

    fn metrics(&self) -> Option<serde_json::Value> {
        self.worker.metrics().ok()
    }

    fn set_config(&self, key: &str, value: &serde_json::Value) -> Result<(), CallError> {
        self.worker.set_config(key, value)
    }

    fn exit_reason(&self) -> Option<String> {
        self.worker.exit_reason()
    }

    fn peak_memory_bytes(&self) -> Option<u64> {
        process_memory(self.worker.pid(), "VmHWM:")
    }

    fn resident_bytes(&self) -> Option<u64> {
        process_memory(self.worker.pid(), "VmRSS:")
    }
}

/// A field in KiB of Linux's `/proc/PID/status` (`VmRSS:`, `VmHWM:` the peak), in bytes.
fn process_memory(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}
