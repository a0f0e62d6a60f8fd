//! Safe views of the ABI's requests and the sinks a plugin streams results into.
//!
//! Requests borrow from the host's call (lifetime `'a`); sinks wrap the host's callbacks and are
//! only usable on the thread and during the call that received them, as the header requires.

use crate::{EngineError, ErrorCode};
use llmr_engine_abi as abi;
use llmr_engine_types::{Format, Sampling};
use std::ffi::{c_void, CStr};
use std::path::PathBuf;

/// What `llmr_engine_get_info` reports.
pub struct EngineInfo {
    pub engine_id: &'static CStr,
    pub version: &'static CStr,
    /// `LLMR_CAP_*` bits.
    pub capabilities: u32,
}

/// Forwards log lines to the host. Safe to use from any engine thread (header: "may be called
/// from any engine thread at any time between create and the return of destroy, concurrently").
#[derive(Clone, Copy)]
pub struct Logger {
    log_fn: abi::llmr_log_fn,
    user_data: *mut c_void,
}

// SAFETY: the header obliges the host's log_fn to accept concurrent calls from any thread.
unsafe impl Send for Logger {}
unsafe impl Sync for Logger {}

impl Logger {
    pub(crate) fn new(log_fn: abi::llmr_log_fn, user_data: *mut c_void) -> Self {
        Self { log_fn, user_data }
    }
    /// A logger that drops everything (for engines created without a log callback).
    pub fn disabled() -> Self {
        Self { log_fn: None, user_data: std::ptr::null_mut() }
    }
    pub fn log(&self, level: u32, message: &str) {
        if let Some(f) = self.log_fn {
            // SAFETY: message is valid for the duration of the call, as the header requires.
            unsafe { f(self.user_data, level, message.as_ptr().cast(), message.len()) }
        }
    }
    pub fn error(&self, message: &str) {
        self.log(abi::LLMR_LOG_ERROR, message)
    }
    pub fn warn(&self, message: &str) {
        self.log(abi::LLMR_LOG_WARN, message)
    }
    pub fn info(&self, message: &str) {
        self.log(abi::LLMR_LOG_INFO, message)
    }
    pub fn debug(&self, message: &str) {
        self.log(abi::LLMR_LOG_DEBUG, message)
    }
}

/// `llmr_engine_config`, owned.
#[derive(Clone)]
pub struct EngineConfig {
    pub gpu_backend: u32,
    pub device_id: i32,
    /// Max concurrent sequences; 0 = the engine's default.
    pub slots: u32,
    pub vram_limit_bytes: u64,
    /// 0 = the model's own.
    pub context_length: u32,
    /// 0 = the engine's default.
    pub threads: u32,
    pub logger: Logger,
    pub device_name: Option<String>,
    pub device_memory_total_bytes: u64,
    pub device_memory_free_bytes: u64,
    pub host_memory_total_bytes: u64,
    /// The manifest's custom parameters (a JSON object; `Null` when none were given).
    pub params: serde_json::Value,
}

/// `llmr_model_desc`, owned.
#[derive(Clone, Debug)]
pub struct ModelDesc {
    pub format: Format,
    pub model_id: String,
    pub model_dir: PathBuf,
    pub primary_file: PathBuf,
    pub architecture: Option<String>,
    pub quantization: Option<String>,
    pub mmproj_file: Option<PathBuf>,
    /// 0 = the instance default.
    pub context_length: u32,
    /// Engine-specific load options (a JSON object; `Null` when none were given).
    pub options: serde_json::Value,
}

/// `llmr_infer_request`, borrowed from the host for the duration of `infer`.
#[derive(Clone, Debug)]
pub struct InferRequest<'a> {
    pub request_id: u64,
    pub model_id: &'a str,
    pub prompt: &'a str,
    pub sampling: Sampling,
    pub parse_special: bool,
    pub add_bos: bool,
    pub ignore_eos: bool,
    /// The prompt as token ids, used as given (`prompt` is then empty); only for plugins that
    /// report `LLMR_CAP_TOKEN_INPUT`.
    pub prompt_tokens: Option<&'a [i32]>,
    /// Write the control tokens the model generates as their text (`LLMR_INFER_SPECIAL_TEXT`;
    /// only for plugins that report `LLMR_CAP_SPECIAL_TEXT`).
    pub special_text: bool,
}

/// Token ids a request gave (`prompt_tokens`, `token_inputs`), checked against the model's
/// vocabulary of `vocab` ids: UNSUPPORTED naming `what` and the first id outside it.
pub fn checked_token_ids(ids: &[i32], vocab: usize, what: &str) -> Result<Vec<u32>, EngineError> {
    match ids.iter().position(|&id| id < 0 || id as usize >= vocab) {
        Some(i) => Err(EngineError::new(
            ErrorCode::Unsupported,
            format!("{what}[{i}] is {}, not a token of this model (its vocabulary has {vocab})", ids[i]),
        )),
        None if ids.is_empty() => Err(EngineError::new(ErrorCode::Unsupported, format!("{what} is empty"))),
        None => Ok(ids.iter().map(|&id| id as u32).collect()),
    }
}

/// One alternative of a generated token.
#[derive(Clone, Copy, Debug)]
pub struct TopLogprob<'a> {
    pub token_id: i32,
    pub logprob: f32,
    pub text: &'a str,
}

/// One generated token, as handed to the host.
#[derive(Clone, Copy, Debug)]
pub struct Token<'a> {
    pub token_id: i32,
    pub text: &'a str,
    pub logprob: f32,
    pub top: &'a [TopLogprob<'a>],
    pub timestamp_ns: u64,
}

/// The host's token callback. Not `Send`: call it on the thread that received it.
pub struct TokenSink {
    callback: abi::llmr_token_fn,
    user_data: *mut c_void,
    scratch: Vec<abi::llmr_top_logprob>,
}

impl TokenSink {
    pub(crate) fn new(callback: abi::llmr_token_fn, user_data: *mut c_void) -> Self {
        Self { callback, user_data, scratch: Vec::new() }
    }

    /// Hands one token to the host. Returns false when the host asks to cancel: the engine must
    /// stop before producing another token and report `FinishReason::Cancelled`.
    pub fn emit(&mut self, token: &Token<'_>) -> bool {
        let Some(callback) = self.callback else {
            return true;
        };
        self.scratch.clear();
        self.scratch.extend(token.top.iter().map(|t| abi::llmr_top_logprob {
            token_id: t.token_id,
            logprob: t.logprob,
            text: str_to_abi(t.text),
        }));
        let raw = abi::llmr_token {
            struct_size: std::mem::size_of::<abi::llmr_token>() as u32,
            token_id: token.token_id,
            text: str_to_abi(token.text),
            logprob: token.logprob,
            top_count: self.scratch.len() as u32,
            top: if self.scratch.is_empty() { std::ptr::null() } else { self.scratch.as_ptr() },
            timestamp_ns: token.timestamp_ns,
        };
        // SAFETY: `raw` and everything it points to outlive the call; the host copies what it keeps.
        unsafe { callback(self.user_data, &raw) }
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
}

/// What `infer` returns when it did not fail. `Cancelled` becomes `LLMR_ERR_CANCELLED` with the
/// result filled in, as the header requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InferOutcome {
    pub finish_reason: FinishReason,
    /// With `Stop`: the index in `Sampling::stop` of the stop sequence that ended the text;
    /// `None` for an end-of-generation token.
    pub stop_index: Option<u32>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub prompt_eval_ns: u64,
    pub generation_ns: u64,
}

/// `llmr_embed_request`, borrowed.
#[derive(Clone, Debug)]
pub struct EmbedRequest<'a> {
    pub request_id: u64,
    pub model_id: &'a str,
    pub inputs: Vec<&'a str>,
    /// The inputs as token ids instead (`inputs` is then empty); only for plugins that report
    /// `LLMR_CAP_TOKEN_INPUT`.
    pub token_inputs: Option<Vec<&'a [i32]>>,
    pub normalize: bool,
}

/// The host's embedding callback.
pub struct EmbeddingSink {
    callback: abi::llmr_embedding_fn,
    user_data: *mut c_void,
}

impl EmbeddingSink {
    pub(crate) fn new(callback: abi::llmr_embedding_fn, user_data: *mut c_void) -> Self {
        Self { callback, user_data }
    }
    /// Delivers the embedding of input `index`. Returns false when the host asks to cancel.
    pub fn emit(&mut self, index: usize, values: &[f32]) -> bool {
        let Some(callback) = self.callback else {
            return true;
        };
        // SAFETY: `values` outlives the call.
        unsafe { callback(self.user_data, index, values.as_ptr(), values.len()) }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbedOutcome {
    pub prompt_tokens: u32,
}

/// `llmr_transcribe_request`, borrowed.
#[derive(Clone, Debug)]
pub struct TranscribeRequest<'a> {
    pub request_id: u64,
    pub model_id: &'a str,
    pub samples: &'a [f32],
    pub sample_rate: u32,
    pub language: Option<&'a str>,
    pub prompt: Option<&'a str>,
    /// 0: greedy with Whisper's temperature fallback; > 0: sample at this temperature.
    pub temperature: f32,
    /// Write the speech in English (minor 2).
    pub translate: bool,
    /// Fill [`Segment::words`] (minor 2).
    pub word_timestamps: bool,
    /// > 1: beam search with this many beams (minor 2).
    pub beam_size: u32,
}

/// One word of a [`Segment`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Word {
    pub start_ms: u64,
    pub end_ms: u64,
    pub text: String,
    pub probability: f32,
}

/// One transcribed segment, as a plugin hands it to [`SegmentSink::emit`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Segment<'a> {
    pub start_ms: u64,
    pub end_ms: u64,
    pub text: &'a str,
    pub words: &'a [Word],
    pub tokens: &'a [i32],
    /// ISO 639-1 code of the speech; empty when unknown.
    pub language: &'a str,
    pub avg_logprob: f32,
    pub no_speech_prob: f32,
    pub temperature: f32,
}

/// The host's segment callback.
pub struct SegmentSink {
    callback: abi::llmr_segment_fn,
    user_data: *mut c_void,
}

impl SegmentSink {
    pub(crate) fn new(callback: abi::llmr_segment_fn, user_data: *mut c_void) -> Self {
        Self { callback, user_data }
    }
    /// Hands a segment to the host; false: the host wants no more (cancel).
    pub fn emit(&mut self, segment: &Segment<'_>) -> bool {
        let Some(callback) = self.callback else {
            return true;
        };
        let words: Vec<abi::llmr_word> = segment
            .words
            .iter()
            .map(|w| abi::llmr_word {
                struct_size: std::mem::size_of::<abi::llmr_word>() as u32,
                probability: w.probability,
                start_ms: w.start_ms,
                end_ms: w.end_ms,
                text: str_to_abi(&w.text),
            })
            .collect();
        let raw = abi::llmr_segment {
            struct_size: std::mem::size_of::<abi::llmr_segment>() as u32,
            reserved: 0,
            start_ms: segment.start_ms,
            end_ms: segment.end_ms,
            text: str_to_abi(segment.text),
            words: if words.is_empty() { std::ptr::null() } else { words.as_ptr() },
            word_count: words.len(),
            tokens: if segment.tokens.is_empty() { std::ptr::null() } else { segment.tokens.as_ptr() },
            token_count: segment.tokens.len(),
            language: str_to_abi(segment.language),
            avg_logprob: segment.avg_logprob,
            no_speech_prob: segment.no_speech_prob,
            temperature: segment.temperature,
            reserved2: 0,
        };
        // SAFETY: `raw` and what it points to outlive the call.
        unsafe { callback(self.user_data, &raw) }
    }
}

/// `llmr_synthesize_request`, borrowed.
#[derive(Clone, Debug)]
pub struct SynthesizeRequest<'a> {
    pub request_id: u64,
    pub model_id: &'a str,
    pub text: &'a str,
    pub voice: Option<&'a str>,
    pub speed: f32,
}

/// The host's audio callback.
pub struct AudioSink {
    callback: abi::llmr_audio_fn,
    user_data: *mut c_void,
}

impl AudioSink {
    pub(crate) fn new(callback: abi::llmr_audio_fn, user_data: *mut c_void) -> Self {
        Self { callback, user_data }
    }
    pub fn emit(&mut self, samples: &[f32], sample_rate: u32) -> bool {
        let Some(callback) = self.callback else {
            return true;
        };
        // SAFETY: `samples` outlives the call.
        unsafe { callback(self.user_data, samples.as_ptr(), samples.len(), sample_rate) }
    }
}

/// `llmr_image_request`, borrowed.
#[derive(Clone, Debug)]
pub struct ImageRequest<'a> {
    pub request_id: u64,
    pub model_id: &'a str,
    pub prompt: &'a str,
    pub negative_prompt: &'a str,
    pub width: u32,
    pub height: u32,
    pub steps: Option<u32>,
    pub guidance_scale: Option<f32>,
    pub count: u32,
    pub seed: Option<u64>,
}

/// The host's image callback.
pub struct ImageSink {
    callback: abi::llmr_image_fn,
    user_data: *mut c_void,
}

impl ImageSink {
    pub(crate) fn new(callback: abi::llmr_image_fn, user_data: *mut c_void) -> Self {
        Self { callback, user_data }
    }
    pub fn emit(&mut self, index: u32, pixels: &[u8], width: u32, height: u32, channels: u32) -> bool {
        let Some(callback) = self.callback else {
            return true;
        };
        // SAFETY: `pixels` outlives the call.
        unsafe { callback(self.user_data, index, pixels.as_ptr(), width, height, channels) }
    }
}

pub(crate) fn str_to_abi(s: &str) -> abi::llmr_str {
    abi::llmr_str { ptr: s.as_ptr().cast(), len: s.len() }
}
