//! The one `Engine` trait the node serves through, and its implementation over a plugin.
//!
//! One `Engine` is one loaded model. The node never touches the C ABI: `PluginEngine` owns an
//! `EngineInstance` (which owns the `unsafe`), so another kind of engine would only implement
//! this trait.

use llmr_engine_host::ModelSpec;
use llmr_engine_host::{abi, CallError, EngineInstance, InferParams, InferResult, InstanceConfig, Plugin, TokenEvent};
use llmr_model_store::{Format, ModelDescriptor};
use std::sync::Arc;

/// What the node needs to know about a loaded model, read once from the engine.
#[derive(Debug, Clone, Default)]
pub struct ModelInfo {
    pub context_length: u32,
    pub vocab_size: u32,
    pub text: bool,
    pub embedding: bool,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Requests the engine runs at once; the node queues the rest.
    pub slots: u32,
    pub architecture: String,
}

pub trait Engine: Send + Sync {
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
        inputs: &[&str],
        normalize: bool,
        on_embedding: &mut dyn FnMut(usize, &[f32]) -> bool,
    ) -> Result<u32, CallError>;
    /// Stops request `request_id` wherever it is (queued, prefill or decode).
    fn cancel(&self, request_id: u64);
    /// The engine's own counters (KV usage, slots), as JSON.
    fn metrics(&self) -> Option<serde_json::Value>;
}

/// Settings the node passes to every engine instance it creates.
#[derive(Debug, Clone, Default)]
pub struct EngineSettings {
    pub slots: u32,
    pub threads: u32,
    /// 0: the engine's default.
    pub context_length: u32,
    pub host_memory_total_bytes: u64,
}

pub struct PluginEngine {
    instance: EngineInstance,
    model_id: String,
    info: ModelInfo,
}

impl PluginEngine {
    /// Creates an instance of `plugin` and loads the model into it (blocking; seconds for big models).
    pub fn load(plugin: &Arc<Plugin>, desc: &ModelDescriptor, settings: &EngineSettings) -> Result<Self, CallError> {
        let instance = EngineInstance::create(
            plugin,
            &InstanceConfig {
                slots: settings.slots,
                threads: settings.threads,
                context_length: settings.context_length,
                host_memory_total_bytes: settings.host_memory_total_bytes,
                ..Default::default()
            },
        )?;
        instance.load_model(&ModelSpec {
            model_id: desc.name.clone(),
            format: match desc.format {
                Format::Gguf => abi::LLMR_FORMAT_GGUF,
                Format::Safetensors => abi::LLMR_FORMAT_SAFETENSORS,
                Format::Onnx => abi::LLMR_FORMAT_ONNX,
            },
            model_dir: desc.model_dir.display().to_string(),
            primary_file: desc.primary_file.display().to_string(),
            architecture: Some(desc.architecture.clone()),
            quantization: desc.quantization.clone(),
            mmproj_file: desc.mmproj.as_ref().map(|p| p.display().to_string()),
            context_length: settings.context_length,
            ..Default::default()
        })?;
        let raw = instance.model_info(&desc.name)?;
        let text = |k: &str| raw[k].as_str().map(str::to_owned);
        let num = |k: &str| raw[k].as_u64().unwrap_or(0).min(u32::MAX as u64) as u32;
        let caps: Vec<&str> =
            raw["capabilities"].as_array().map(|a| a.iter().filter_map(|c| c.as_str()).collect()).unwrap_or_default();
        let info = ModelInfo {
            context_length: num("context_length"),
            vocab_size: num("vocab_size"),
            text: caps.contains(&"text"),
            embedding: caps.contains(&"embedding"),
            chat_template: text("chat_template"),
            bos_token: text("bos_token"),
            eos_token: text("eos_token"),
            slots: match num("slots") {
                0 => settings.slots.max(1),
                n => n,
            },
            architecture: desc.architecture.clone(),
        };
        Ok(PluginEngine { instance, model_id: desc.name.clone(), info })
    }
}

impl Engine for PluginEngine {
    fn info(&self) -> &ModelInfo {
        &self.info
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
        inputs: &[&str],
        normalize: bool,
        on_embedding: &mut dyn FnMut(usize, &[f32]) -> bool,
    ) -> Result<u32, CallError> {
        self.instance.embed(request_id, &self.model_id, inputs, normalize, on_embedding)
    }

    fn cancel(&self, request_id: u64) {
        // Unknown ids are fine: the request may have just finished.
        let _ = self.instance.cancel(request_id);
    }

    fn metrics(&self) -> Option<serde_json::Value> {
        self.instance.metrics().ok()
    }
}

impl Drop for PluginEngine {
    fn drop(&mut self) {
        if let Err(e) = self.instance.unload_model(&self.model_id) {
            tracing::warn!(model = %self.model_id, "unload failed: {}", e.message);
        }
    }
}
