//! One engine instance created by a plugin: RAII around `llmr_engine_create`/`destroy`, and safe
//! wrappers for every other export.
//!
//! Callbacks into host closures go through `extern "C"` trampolines that catch panics: a host
//! panic must not unwind through the plugin's frames either. A panicking closure cancels the
//! request and the panic resumes once the plugin call has returned.

use crate::manifest::GpuBackend;
use crate::plugin::Plugin;
use crate::status::{CallError, EngineStatus};
use llmr_engine_abi as abi;
use llmr_engine_types::{Constraint, Format, ModelInfo, Sampling};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

/// Settings for `llmr_engine_create`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InstanceConfig {
    pub gpu_backend: Option<GpuBackend>,
    pub device_id: Option<i32>,
    pub slots: u32,
    pub vram_limit_bytes: u64,
    pub context_length: u32,
    pub threads: u32,
    pub device_name: Option<String>,
    pub device_memory_total_bytes: u64,
    pub device_memory_free_bytes: u64,
    pub host_memory_total_bytes: u64,
}

/// A model to load (the node's ModelDescriptor, as the ABI needs it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelSpec {
    pub model_id: String,
    pub format: Format,
    pub model_dir: String,
    pub primary_file: String,
    pub architecture: Option<String>,
    pub quantization: Option<String>,
    pub mmproj_file: Option<String>,
    pub context_length: u32,
    pub options: Option<serde_json::Value>,
}

impl ModelSpec {
    /// A model of `format` in `primary_file`, with every optional field unset.
    pub fn new(model_id: impl Into<String>, format: Format, primary_file: impl Into<String>) -> Self {
        let primary_file = primary_file.into();
        let model_dir = std::path::Path::new(&primary_file).parent().map(|d| d.display().to_string());
        ModelSpec {
            model_id: model_id.into(),
            format,
            model_dir: model_dir.unwrap_or_default(),
            primary_file,
            architecture: None,
            quantization: None,
            mmproj_file: None,
            context_length: 0,
            options: None,
        }
    }
}

/// A text generation request.
#[derive(Clone, Debug)]
pub struct InferParams<'a> {
    pub request_id: u64,
    pub model_id: &'a str,
    pub prompt: &'a str,
    pub sampling: Sampling,
    pub parse_special: bool,
    pub add_bos: bool,
    pub ignore_eos: bool,
    /// The prompt as token ids instead of text (`prompt` is then ignored): OpenAI's arrays of
    /// integers. Only plugins reporting `LLMR_CAP_TOKEN_INPUT` take them.
    pub prompt_tokens: Option<&'a [i32]>,
    /// Control tokens the model generates are written as their text (gpt-oss's harmony markers);
    /// only plugins reporting `LLMR_CAP_SPECIAL_TEXT` take it.
    pub special_text: bool,
}

/// Embedding inputs: texts, or token ids (only for plugins reporting `LLMR_CAP_TOKEN_INPUT`).
#[derive(Clone, Copy, Debug)]
pub enum EmbedInputs<'a> {
    Texts(&'a [&'a str]),
    Tokens(&'a [&'a [i32]]),
}

impl<'a> InferParams<'a> {
    /// The prompt with the model's BOS, special tokens parsed, stopping at EOS.
    pub fn new(request_id: u64, model_id: &'a str, prompt: &'a str, sampling: Sampling) -> Self {
        Self {
            request_id,
            model_id,
            prompt,
            sampling,
            parse_special: true,
            add_bos: true,
            ignore_eos: false,
            prompt_tokens: None,
            special_text: false,
        }
    }

    /// Greedy decoding with every sampler off.
    pub fn greedy(request_id: u64, model_id: &'a str, prompt: &'a str) -> Self {
        Self::new(request_id, model_id, prompt, Sampling::greedy())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token_id: i32,
    pub logprob: f32,
    pub text: String,
}

/// One streamed token, borrowed from the plugin for the duration of the callback.
#[derive(Debug)]
pub struct TokenEvent<'a> {
    pub token_id: i32,
    /// Invalid UTF-8 from a misbehaving plugin is replaced, never trusted.
    pub text: Cow<'a, str>,
    pub logprob: f32,
    pub top: Vec<TopLogprob>,
    pub timestamp_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InferResult {
    pub finish_reason: FinishReason,
    /// The index in the request's stop sequences of the one that ended the generation (minor 3
    /// plugins); `None` for an end-of-generation token or an older plugin.
    pub stop_index: Option<u32>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub prompt_eval_ns: u64,
    pub generation_ns: u64,
}

/// Owned by the instance; its address is the log callback's user data until destroy returns.
struct LogContext {
    engine_id: String,
}

pub struct EngineInstance {
    handle: NonNull<abi::llmr_engine>,
    _log: Box<LogContext>,
    // Declared last so the library outlives the handle (Drop destroys the handle first).
    plugin: Arc<Plugin>,
}

// SAFETY: the header requires plugins to accept calls on one handle from any thread, concurrently.
unsafe impl Send for EngineInstance {}
unsafe impl Sync for EngineInstance {}

impl std::fmt::Debug for EngineInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineInstance").field("engine", &self.plugin.id()).finish()
    }
}

pub(crate) fn cstring(value: &str, name: &str) -> Result<CString, CallError> {
    CString::new(value)
        .map_err(|_| CallError { status: EngineStatus::Internal, message: format!("`{name}` contains a NUL byte") })
}

pub(crate) fn opt_cstring(value: Option<&str>, name: &str) -> Result<Option<CString>, CallError> {
    value.map(|v| cstring(v, name)).transpose()
}

pub(crate) fn ptr_or_null(value: &Option<CString>) -> *const c_char {
    value.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

pub(crate) fn abi_str(s: &str) -> abi::llmr_str {
    abi::llmr_str { ptr: s.as_ptr().cast(), len: s.len() }
}

/// Bytes the plugin lent us, tolerating NULL.
pub(crate) unsafe fn lent_bytes<'a>(s: abi::llmr_str) -> &'a [u8] {
    if s.ptr.is_null() || s.len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(s.ptr as *const u8, s.len)
    }
}

unsafe extern "C" fn forward_log(user_data: *mut c_void, level: u32, message: *const c_char, len: usize) {
    let _ = catch_unwind(|| {
        let Some(ctx) = (user_data as *const LogContext).as_ref() else {
            return;
        };
        let text = String::from_utf8_lossy(lent_bytes(abi::llmr_str { ptr: message, len }));
        let text = text.trim_end();
        let engine = ctx.engine_id.as_str();
        match level {
            abi::LLMR_LOG_ERROR => tracing::error!(target: "llmr::engine", engine, "{text}"),
            abi::LLMR_LOG_WARN => tracing::warn!(target: "llmr::engine", engine, "{text}"),
            abi::LLMR_LOG_INFO => tracing::info!(target: "llmr::engine", engine, "{text}"),
            abi::LLMR_LOG_DEBUG => tracing::debug!(target: "llmr::engine", engine, "{text}"),
            _ => tracing::trace!(target: "llmr::engine", engine, "{text}"),
        }
    });
}

unsafe extern "C" fn collect_text(user_data: *mut c_void, data: *const c_char, len: usize) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(buf) = (user_data as *mut Vec<u8>).as_mut() {
            buf.extend_from_slice(lent_bytes(abi::llmr_str { ptr: data, len }));
        }
    }));
}

/// State shared with a callback trampoline: the closure and a panic to resume afterwards.
pub(crate) struct CallbackState<F> {
    pub(crate) f: F,
    pub(crate) panic: Option<Box<dyn std::any::Any + Send>>,
}

impl<F> CallbackState<F> {
    pub(crate) fn call(&mut self, body: impl FnOnce(&mut F) -> bool) -> bool {
        if self.panic.is_some() {
            return false;
        }
        match catch_unwind(AssertUnwindSafe(|| body(&mut self.f))) {
            Ok(keep_going) => keep_going,
            Err(p) => {
                self.panic = Some(p);
                false
            }
        }
    }
    pub(crate) fn resume_panic(self) {
        if let Some(p) = self.panic {
            resume_unwind(p);
        }
    }
}

unsafe extern "C" fn token_trampoline<F: FnMut(&TokenEvent<'_>) -> bool>(
    user_data: *mut c_void,
    token: *const abi::llmr_token,
) -> bool {
    let state = &mut *(user_data as *mut CallbackState<F>);
    let Some(t) = token.as_ref() else { return true };
    state.call(|f| {
        let top = if t.top.is_null() || t.top_count == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(t.top, t.top_count as usize)
                .iter()
                .map(|a| TopLogprob {
                    token_id: a.token_id,
                    logprob: a.logprob,
                    text: String::from_utf8_lossy(lent_bytes(a.text)).into_owned(),
                })
                .collect()
        };
        let event = TokenEvent {
            token_id: t.token_id,
            text: String::from_utf8_lossy(lent_bytes(t.text)),
            logprob: t.logprob,
            top,
            timestamp_ns: t.timestamp_ns,
        };
        f(&event)
    })
}

unsafe extern "C" fn embedding_trampoline<F: FnMut(usize, &[f32]) -> bool>(
    user_data: *mut c_void,
    index: usize,
    values: *const f32,
    dim: usize,
) -> bool {
    let state = &mut *(user_data as *mut CallbackState<F>);
    let values = if values.is_null() || dim == 0 { &[][..] } else { std::slice::from_raw_parts(values, dim) };
    state.call(|f| f(index, values))
}

unsafe extern "C" fn reject_segment(_: *mut c_void, _: *const abi::llmr_segment) -> bool {
    true
}
unsafe extern "C" fn reject_audio(_: *mut c_void, _: *const f32, _: usize, _: u32) -> bool {
    true
}
unsafe extern "C" fn reject_image(_: *mut c_void, _: u32, _: *const u8, _: u32, _: u32, _: u32) -> bool {
    true
}

impl EngineInstance {
    pub fn create(plugin: &Arc<Plugin>, config: &InstanceConfig) -> Result<EngineInstance, CallError> {
        let log = Box::new(LogContext { engine_id: plugin.id().to_string() });
        let device_name = opt_cstring(config.device_name.as_deref(), "device_name")?;
        let params = serde_json::Value::Object(plugin.manifest.parameters.clone()).to_string();
        let params = cstring(&params, "params_json")?;
        let backend = config.gpu_backend.unwrap_or(plugin.manifest.gpu_backends[0]);
        let raw = abi::llmr_engine_config {
            struct_size: std::mem::size_of::<abi::llmr_engine_config>() as u32,
            gpu_backend: backend.abi(),
            device_id: config.device_id.unwrap_or(-1),
            slots: config.slots,
            vram_limit_bytes: config.vram_limit_bytes,
            context_length: config.context_length,
            threads: config.threads,
            log_fn: Some(forward_log),
            log_user_data: &*log as *const LogContext as *mut c_void,
            device_name: ptr_or_null(&device_name),
            device_memory_total_bytes: config.device_memory_total_bytes,
            device_memory_free_bytes: config.device_memory_free_bytes,
            host_memory_total_bytes: config.host_memory_total_bytes,
            params_json: params.as_ptr(),
        };
        let mut out: *mut abi::llmr_engine = std::ptr::null_mut();
        // SAFETY: `raw` and everything it points to live across the call; `log` lives as long as
        // the instance, which covers every log call the header allows.
        let status = unsafe { (plugin.exports.create)(&raw, &mut out) };
        if let Some(status) = EngineStatus::from_raw(status) {
            return Err(CallError { status, message: last_error(plugin, std::ptr::null()) });
        }
        let handle = NonNull::new(out).ok_or_else(|| CallError {
            status: EngineStatus::Internal,
            message: "llmr_engine_create returned OK but no handle".into(),
        })?;
        Ok(EngineInstance { handle, _log: log, plugin: plugin.clone() })
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// UNSUPPORTED unless the plugin reports `capability`: what a newer minor version added is
    /// sent only to plugins that say they read it (an older one would silently ignore the
    /// fields beyond its struct).
    pub(crate) fn require(&self, capability: u32, what: &str) -> Result<(), CallError> {
        if self.plugin.info.capabilities & capability != 0 {
            return Ok(());
        }
        Err(CallError {
            status: EngineStatus::Unsupported,
            message: format!("engine '{}' does not support {what}", self.plugin.info.engine_id),
        })
    }

    pub(crate) fn check(&self, status: abi::llmr_status) -> Result<(), CallError> {
        match EngineStatus::from_raw(status) {
            None => Ok(()),
            Some(status) => Err(CallError { status, message: last_error(&self.plugin, self.handle.as_ptr()) }),
        }
    }

    pub(crate) fn raw(&self) -> *mut abi::llmr_engine {
        self.handle.as_ptr()
    }

    pub fn load_model(&self, spec: &ModelSpec) -> Result<(), CallError> {
        let model_id = cstring(&spec.model_id, "model_id")?;
        let model_dir = cstring(&spec.model_dir, "model_dir")?;
        let primary = cstring(&spec.primary_file, "primary_file")?;
        let arch = opt_cstring(spec.architecture.as_deref(), "architecture")?;
        let quant = opt_cstring(spec.quantization.as_deref(), "quantization")?;
        let mmproj = opt_cstring(spec.mmproj_file.as_deref(), "mmproj_file")?;
        let options = opt_cstring(spec.options.as_ref().map(|o| o.to_string()).as_deref(), "options")?;
        let raw = abi::llmr_model_desc {
            struct_size: std::mem::size_of::<abi::llmr_model_desc>() as u32,
            format: spec.format.to_abi(),
            model_id: model_id.as_ptr(),
            model_dir: model_dir.as_ptr(),
            primary_file: primary.as_ptr(),
            architecture: ptr_or_null(&arch),
            quantization: ptr_or_null(&quant),
            mmproj_file: ptr_or_null(&mmproj),
            context_length: spec.context_length,
            options_json: ptr_or_null(&options),
        };
        // SAFETY: everything `raw` points to lives across the call.
        self.check(unsafe { (self.plugin.exports.load_model)(self.raw(), &raw) })
    }

    pub fn unload_model(&self, model_id: &str) -> Result<(), CallError> {
        let model_id = cstring(model_id, "model_id")?;
        self.check(unsafe { (self.plugin.exports.unload_model)(self.raw(), model_id.as_ptr()) })
    }

    /// What the engine reports about a loaded model; a document that does not parse is an
    /// error naming the key, never a silently empty field.
    pub fn model_info(&self, model_id: &str) -> Result<ModelInfo, CallError> {
        let model_id = cstring(model_id, "model_id")?;
        let mut buf = Vec::<u8>::new();
        self.check(unsafe {
            (self.plugin.exports.model_info)(
                self.raw(),
                model_id.as_ptr(),
                Some(collect_text),
                &mut buf as *mut _ as *mut c_void,
            )
        })?;
        ModelInfo::from_json(&buf).map_err(|e| CallError {
            status: EngineStatus::Internal,
            message: format!("llmr_engine_model_info returned an unusable document: {e}"),
        })
    }

    pub fn metrics(&self) -> Result<serde_json::Value, CallError> {
        let mut buf = Vec::<u8>::new();
        self.check(unsafe {
            (self.plugin.exports.get_metrics)(self.raw(), Some(collect_text), &mut buf as *mut _ as *mut c_void)
        })?;
        parse_json_reply(&buf, "llmr_engine_get_metrics")
    }

    pub fn tokenize(
        &self,
        model_id: &str,
        text: &str,
        add_bos: bool,
        parse_special: bool,
    ) -> Result<Vec<i32>, CallError> {
        let model_id = cstring(model_id, "model_id")?;
        let flags = if add_bos { abi::LLMR_INFER_ADD_BOS } else { 0 }
            | if parse_special { abi::LLMR_INFER_PARSE_SPECIAL } else { 0 };
        // Guess generously (one token per 2 bytes), retry once with the exact size.
        let mut tokens = vec![0i32; text.len() / 2 + 16];
        for _ in 0..2 {
            let mut count = 0usize;
            self.check(unsafe {
                (self.plugin.exports.tokenize)(
                    self.raw(),
                    model_id.as_ptr(),
                    abi_str(text),
                    flags,
                    tokens.as_mut_ptr(),
                    tokens.len(),
                    &mut count,
                )
            })?;
            if count <= tokens.len() {
                tokens.truncate(count);
                return Ok(tokens);
            }
            tokens.resize(count, 0);
        }
        Err(CallError { status: EngineStatus::Internal, message: "llmr_engine_tokenize kept growing its count".into() })
    }

    /// Generates text, calling `on_token` for each token; returning false cancels. A cancelled
    /// request (by `on_token` or `cancel`) is `Ok` with `FinishReason::Cancelled`.
    pub fn infer<F>(&self, params: &InferParams<'_>, on_token: F) -> Result<InferResult, CallError>
    where
        F: FnMut(&TokenEvent<'_>) -> bool,
    {
        let model_id = cstring(params.model_id, "model_id")?;
        let s = &params.sampling;
        let stops: Vec<abi::llmr_str> = s.stop.iter().map(|s| abi_str(s)).collect();
        if params.prompt_tokens.is_some() {
            self.require(abi::LLMR_CAP_TOKEN_INPUT, "token-id prompts")?;
        }
        if s.constraint.is_some() {
            self.require(abi::LLMR_CAP_CONSTRAINED, "constrained output")?;
        }
        if params.special_text {
            self.require(abi::LLMR_CAP_SPECIAL_TEXT, "control tokens written as text")?;
        }
        let prompt_tokens = params.prompt_tokens.unwrap_or_default();
        let (constraint_kind, constraint) = match &s.constraint {
            None => (abi::LLMR_CONSTRAINT_NONE, ""),
            Some(Constraint::JsonSchema(text)) => (abi::LLMR_CONSTRAINT_JSON_SCHEMA, text.as_str()),
            Some(Constraint::Regex(text)) => (abi::LLMR_CONSTRAINT_REGEX, text.as_str()),
            Some(Constraint::Lark(text)) => (abi::LLMR_CONSTRAINT_LARK, text.as_str()),
        };
        let mut flags = 0;
        for (on, bit) in [
            (s.seed.is_some(), abi::LLMR_INFER_SEED_SET),
            (s.logprobs.is_some(), abi::LLMR_INFER_LOGPROBS),
            (params.parse_special, abi::LLMR_INFER_PARSE_SPECIAL),
            (params.add_bos, abi::LLMR_INFER_ADD_BOS),
            (params.ignore_eos, abi::LLMR_INFER_IGNORE_EOS),
            (!s.speculative, abi::LLMR_INFER_NO_SPECULATION),
            (params.special_text, abi::LLMR_INFER_SPECIAL_TEXT),
        ] {
            if on {
                flags |= bit;
            }
        }
        let raw = abi::llmr_infer_request {
            struct_size: std::mem::size_of::<abi::llmr_infer_request>() as u32,
            flags,
            request_id: params.request_id,
            model_id: model_id.as_ptr(),
            prompt: abi_str(params.prompt),
            max_tokens: s.max_tokens.unwrap_or(0),
            top_k: s.top_k.unwrap_or(0),
            temperature: s.temperature,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repeat_penalty,
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
            seed: s.seed.unwrap_or(0),
            stop: if stops.is_empty() { std::ptr::null() } else { stops.as_ptr() },
            stop_count: stops.len(),
            top_logprobs: s.logprobs.unwrap_or(0),
            constraint_kind,
            constraint: abi_str(constraint),
            prompt_tokens: abi::llmr_tokens { ids: prompt_tokens.as_ptr(), count: prompt_tokens.len() },
        };
        let mut state = CallbackState { f: on_token, panic: None };
        let mut result = abi::llmr_infer_result {
            struct_size: std::mem::size_of::<abi::llmr_infer_result>() as u32,
            ..Default::default()
        };
        // SAFETY: `raw`, the strings it points to, `state` and `result` outlive the call; the
        // trampoline's type matches `state`.
        let status = unsafe {
            (self.plugin.exports.infer)(
                self.raw(),
                &raw,
                Some(token_trampoline::<F>),
                &mut state as *mut CallbackState<F> as *mut c_void,
                &mut result,
            )
        };
        let outcome = self.check(status);
        state.resume_panic();
        let finish_reason = match outcome {
            Ok(()) if result.finish_reason == abi::LLMR_FINISH_LENGTH => FinishReason::Length,
            Ok(()) => FinishReason::Stop,
            Err(CallError { status: EngineStatus::Cancelled, .. }) => FinishReason::Cancelled,
            Err(e) => return Err(e),
        };
        // Before minor 3 the field was reserved: read it only from plugins that know it, and only
        // as an index into the stops this request sent.
        let stop_index = (finish_reason == FinishReason::Stop && self.plugin.info.abi_minor >= 3)
            .then(|| result.stop_index.checked_sub(1))
            .flatten()
            .filter(|&i| (i as usize) < params.sampling.stop.len());
        Ok(InferResult {
            finish_reason,
            stop_index,
            prompt_tokens: result.prompt_tokens,
            completion_tokens: result.completion_tokens,
            cached_tokens: result.cached_tokens,
            prompt_eval_ns: result.prompt_eval_ns,
            generation_ns: result.generation_ns,
        })
    }

    /// Computes embeddings; `on_embedding(index, values)` returning false cancels. Returns the
    /// prompt token count.
    pub fn embed<F>(
        &self,
        request_id: u64,
        model_id: &str,
        inputs: &[&str],
        normalize: bool,
        on_embedding: F,
    ) -> Result<u32, CallError>
    where
        F: FnMut(usize, &[f32]) -> bool,
    {
        self.embed_inputs(request_id, model_id, EmbedInputs::Texts(inputs), normalize, on_embedding)
    }

    /// [`embed`](Self::embed) of texts or of token ids.
    pub fn embed_inputs<F>(
        &self,
        request_id: u64,
        model_id: &str,
        inputs: EmbedInputs<'_>,
        normalize: bool,
        on_embedding: F,
    ) -> Result<u32, CallError>
    where
        F: FnMut(usize, &[f32]) -> bool,
    {
        let model_id = cstring(model_id, "model_id")?;
        let (raw_inputs, raw_tokens): (Vec<abi::llmr_str>, Vec<abi::llmr_tokens>) = match inputs {
            EmbedInputs::Texts(texts) => (texts.iter().map(|s| abi_str(s)).collect(), Vec::new()),
            EmbedInputs::Tokens(lists) => {
                self.require(abi::LLMR_CAP_TOKEN_INPUT, "token-id inputs")?;
                (Vec::new(), lists.iter().map(|t| abi::llmr_tokens { ids: t.as_ptr(), count: t.len() }).collect())
            }
        };
        let tokens = matches!(inputs, EmbedInputs::Tokens(_));
        let raw = abi::llmr_embed_request {
            struct_size: std::mem::size_of::<abi::llmr_embed_request>() as u32,
            flags: if normalize { abi::LLMR_EMBED_NORMALIZE } else { 0 },
            request_id,
            model_id: model_id.as_ptr(),
            inputs: if tokens { std::ptr::null() } else { raw_inputs.as_ptr() },
            input_count: if tokens { raw_tokens.len() } else { raw_inputs.len() },
            token_inputs: if tokens { raw_tokens.as_ptr() } else { std::ptr::null() },
        };
        let mut state = CallbackState { f: on_embedding, panic: None };
        let mut result = abi::llmr_embed_result {
            struct_size: std::mem::size_of::<abi::llmr_embed_result>() as u32,
            prompt_tokens: 0,
        };
        let status = unsafe {
            (self.plugin.exports.embed)(
                self.raw(),
                &raw,
                Some(embedding_trampoline::<F>),
                &mut state as *mut CallbackState<F> as *mut c_void,
                &mut result,
            )
        };
        let outcome = self.check(status);
        state.resume_panic();
        outcome.map(|()| result.prompt_tokens)
    }

    /// Asks the plugin to transcribe silence; used to probe whether ASR is supported.
    pub fn probe_transcribe(&self, model_id: &str) -> Result<(), CallError> {
        let model_id = cstring(model_id, "model_id")?;
        let samples = [0.0f32; 160];
        let raw = abi::llmr_transcribe_request {
            struct_size: std::mem::size_of::<abi::llmr_transcribe_request>() as u32,
            sample_rate: 16_000,
            request_id: 0,
            model_id: model_id.as_ptr(),
            samples: samples.as_ptr(),
            sample_count: samples.len(),
            language: std::ptr::null(),
            prompt: std::ptr::null(),
            temperature: 0.0,
            padding_1_0: 0,
            flags: 0,
            beam_size: 0,
            reserved: 0,
        };
        self.check(unsafe {
            (self.plugin.exports.transcribe)(self.raw(), &raw, Some(reject_segment), std::ptr::null_mut())
        })
    }

    /// Asks the plugin to speak one word; used to probe whether TTS is supported.
    pub fn probe_synthesize(&self, model_id: &str) -> Result<(), CallError> {
        let model_id = cstring(model_id, "model_id")?;
        let raw = abi::llmr_synthesize_request {
            struct_size: std::mem::size_of::<abi::llmr_synthesize_request>() as u32,
            reserved: 0,
            request_id: 0,
            model_id: model_id.as_ptr(),
            text: abi_str("hello"),
            voice: std::ptr::null(),
            speed: 1.0,
        };
        self.check(unsafe {
            (self.plugin.exports.synthesize)(self.raw(), &raw, Some(reject_audio), std::ptr::null_mut())
        })
    }

    /// Asks the plugin for one tiny image; used to probe whether image generation is supported.
    pub fn probe_generate_image(&self, model_id: &str) -> Result<(), CallError> {
        let model_id = cstring(model_id, "model_id")?;
        let raw = abi::llmr_image_request {
            struct_size: std::mem::size_of::<abi::llmr_image_request>() as u32,
            width: 64,
            height: 64,
            steps: 1,
            request_id: 0,
            model_id: model_id.as_ptr(),
            prompt: abi_str("a dot"),
            negative_prompt: abi_str(""),
            guidance_scale: 0.0,
            count: 1,
            seed: 0,
            seed_set: 0,
        };
        self.check(unsafe {
            (self.plugin.exports.generate_image)(self.raw(), &raw, Some(reject_image), std::ptr::null_mut())
        })
    }

    pub fn cancel(&self, request_id: u64) -> Result<(), CallError> {
        self.check(unsafe { (self.plugin.exports.cancel)(self.raw(), request_id) })
    }

    pub fn set_config(&self, model_id: Option<&str>, key: &str, value: &serde_json::Value) -> Result<(), CallError> {
        let model_id = opt_cstring(model_id, "model_id")?;
        let key = cstring(key, "key")?;
        let value = cstring(&value.to_string(), "value")?;
        self.check(unsafe {
            (self.plugin.exports.set_config)(self.raw(), ptr_or_null(&model_id), key.as_ptr(), value.as_ptr())
        })
    }

    /// Direct access to an export with raw arguments, for conformance checks that pass bad input
    /// on purpose (NULL pointers, wrong sizes).
    ///
    /// # Safety
    /// The caller must uphold whatever the header allows a host to pass.
    pub unsafe fn raw_infer(
        &self,
        request: *const abi::llmr_infer_request,
        result: *mut abi::llmr_infer_result,
    ) -> Result<(), CallError> {
        self.check((self.plugin.exports.infer)(self.raw(), request, None, std::ptr::null_mut(), result))
    }
}

impl Drop for EngineInstance {
    fn drop(&mut self) {
        // SAFETY: `&mut self` proves no other call on this handle is running.
        let status = unsafe { (self.plugin.exports.destroy)(self.raw()) };
        if EngineStatus::from_raw(status).is_some() {
            tracing::error!(
                engine = self.plugin.id(),
                "llmr_engine_destroy failed: {}",
                last_error(&self.plugin, self.raw())
            );
        }
    }
}

fn parse_json_reply(buf: &[u8], what: &str) -> Result<serde_json::Value, CallError> {
    serde_json::from_slice(buf)
        .map_err(|e| CallError { status: EngineStatus::Internal, message: format!("{what} wrote invalid JSON: {e}") })
}

/// The plugin's last error for `handle` on this thread, copied.
fn last_error(plugin: &Plugin, handle: *const abi::llmr_engine) -> String {
    // SAFETY: last_error never returns a dangling pointer per the header; NULL is tolerated.
    let ptr = unsafe { (plugin.exports.last_error)(handle) };
    if ptr.is_null() {
        return "(the plugin gave no error message)".into();
    }
    let msg = unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned();
    if msg.is_empty() {
        "(the plugin gave no error message)".into()
    } else {
        msg
    }
}
