//! The one `Engine` trait the node serves through, and its implementation over a plugin.
//!
//! One `Engine` is one loaded model. The node never touches the C ABI: `PluginEngine` owns an
//! `EngineInstance` (which owns the `unsafe`), so another kind of engine would only implement
//! this trait.

use llmr_engine_host::{
    abi, CallError, EmbedInputs, EngineInstance, InferParams, InferResult, InstanceConfig, ModelInfo, ModelSpec,
    Plugin, Segment, SynthesizeParams, TokenEvent, TranscribeParams,
};
use llmr_model_store::ModelDescriptor;
use std::sync::Arc;

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
        instance.load_model(&model_spec(desc, settings))?;
        let mut info = instance.model_info(&desc.name)?;
        // An engine that does not say how many requests it runs at once runs what it was asked to.
        info.slots = Some(info.slots.filter(|&n| n > 0).unwrap_or(settings.slots.max(1)));
        info.architecture = Some(desc.architecture.clone());
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
