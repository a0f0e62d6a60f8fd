//! `#[repr(C)]` mirror of `include/llmr_engine.h`, the llmr engine plugin ABI.
//!
//! The header is the source of truth; every doc comment about ownership, lifetimes and threading
//! lives there and applies here unchanged. This crate holds types and constants only, no logic.
//! `tests/header_layout.rs` compiles the header with the system C compiler and fails when a size,
//! an offset or a constant here disagrees with it.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// Path of the committed C header, for build scripts and tests.
pub const HEADER_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/include/llmr_engine.h");

pub const LLMR_ENGINE_ABI_MAJOR: u32 = 1;
pub const LLMR_ENGINE_ABI_MINOR: u32 = 5;

pub type llmr_status = i32;
pub const LLMR_OK: llmr_status = 0;
pub const LLMR_ERR_OOM_VRAM: llmr_status = 1;
pub const LLMR_ERR_OOM_RAM: llmr_status = 2;
pub const LLMR_ERR_MODEL_CORRUPT: llmr_status = 3;
pub const LLMR_ERR_TIMEOUT: llmr_status = 4;
pub const LLMR_ERR_CANCELLED: llmr_status = 5;
pub const LLMR_ERR_UNSUPPORTED: llmr_status = 6;
pub const LLMR_ERR_INTERNAL: llmr_status = 7;
pub const LLMR_ERR_ABI_MISMATCH: llmr_status = 8;
pub const LLMR_ERR_LOAD_FAILED: llmr_status = 9;

pub const LLMR_GPU_METAL: u32 = 0;
pub const LLMR_GPU_DIRECTML: u32 = 1;
pub const LLMR_GPU_CUDA: u32 = 2;
pub const LLMR_GPU_CPU: u32 = 255;

pub const LLMR_FORMAT_GGUF: u32 = 0;
pub const LLMR_FORMAT_SAFETENSORS: u32 = 1;
pub const LLMR_FORMAT_ONNX: u32 = 2;
pub const LLMR_FORMAT_GGML: u32 = 3;
pub const LLMR_FORMAT_UNKNOWN: u32 = 255;

pub const LLMR_CAP_TEXT: u32 = 1 << 0;
pub const LLMR_CAP_EMBEDDING: u32 = 1 << 1;
pub const LLMR_CAP_VISION: u32 = 1 << 2;
pub const LLMR_CAP_ASR: u32 = 1 << 3;
pub const LLMR_CAP_TTS: u32 = 1 << 4;
pub const LLMR_CAP_IMAGE: u32 = 1 << 5;
pub const LLMR_CAP_CONSTRAINED: u32 = 1 << 6;
pub const LLMR_CAP_TOKEN_INPUT: u32 = 1 << 7;
pub const LLMR_CAP_SPECIAL_TEXT: u32 = 1 << 8;

pub const LLMR_LOG_ERROR: u32 = 1;
pub const LLMR_LOG_WARN: u32 = 2;
pub const LLMR_LOG_INFO: u32 = 3;
pub const LLMR_LOG_DEBUG: u32 = 4;
pub const LLMR_LOG_TRACE: u32 = 5;

pub const LLMR_FINISH_NONE: u32 = 0;
pub const LLMR_FINISH_STOP: u32 = 1;
pub const LLMR_FINISH_LENGTH: u32 = 2;
pub const LLMR_FINISH_CANCELLED: u32 = 3;
pub const LLMR_FINISH_ERROR: u32 = 4;

pub const LLMR_INFER_SEED_SET: u32 = 1 << 0;
pub const LLMR_INFER_LOGPROBS: u32 = 1 << 1;
pub const LLMR_INFER_PARSE_SPECIAL: u32 = 1 << 2;
pub const LLMR_INFER_ADD_BOS: u32 = 1 << 3;
pub const LLMR_INFER_IGNORE_EOS: u32 = 1 << 4;
pub const LLMR_INFER_NO_SPECULATION: u32 = 1 << 5;
pub const LLMR_INFER_SPECIAL_TEXT: u32 = 1 << 6;

pub const LLMR_CONSTRAINT_NONE: u32 = 0;
pub const LLMR_CONSTRAINT_JSON_SCHEMA: u32 = 1;
pub const LLMR_CONSTRAINT_REGEX: u32 = 2;
pub const LLMR_CONSTRAINT_LARK: u32 = 3;

pub const LLMR_TRANSCRIBE_TRANSLATE: u32 = 1 << 0;
pub const LLMR_TRANSCRIBE_WORD_TIMESTAMPS: u32 = 1 << 1;

pub const LLMR_EMBED_NORMALIZE: u32 = 1 << 0;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llmr_str {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llmr_tokens {
    pub ids: *const i32,
    pub count: usize,
}

/// Opaque engine instance (`struct llmr_engine`).
#[repr(C)]
pub struct llmr_engine {
    _private: [u8; 0],
}

pub type llmr_write_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, data: *const c_char, len: usize)>;
pub type llmr_log_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, level: u32, message: *const c_char, len: usize)>;

#[repr(C)]
#[derive(Debug)]
pub struct llmr_engine_info {
    pub struct_size: u32,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub capabilities: u32,
    pub engine_id: *const c_char,
    pub version: *const c_char,
}

// SAFETY: the info block is immutable static data whose pointers refer to static strings.
unsafe impl Sync for llmr_engine_info {}

#[repr(C)]
pub struct llmr_engine_config {
    pub struct_size: u32,
    pub gpu_backend: u32,
    pub device_id: i32,
    pub slots: u32,
    pub vram_limit_bytes: u64,
    pub context_length: u32,
    pub threads: u32,
    pub log_fn: llmr_log_fn,
    pub log_user_data: *mut c_void,
    pub device_name: *const c_char,
    pub device_memory_total_bytes: u64,
    pub device_memory_free_bytes: u64,
    pub host_memory_total_bytes: u64,
    pub params_json: *const c_char,
}

#[repr(C)]
pub struct llmr_model_desc {
    pub struct_size: u32,
    pub format: u32,
    pub model_id: *const c_char,
    pub model_dir: *const c_char,
    pub primary_file: *const c_char,
    pub architecture: *const c_char,
    pub quantization: *const c_char,
    pub mmproj_file: *const c_char,
    pub context_length: u32,
    pub options_json: *const c_char,
}

#[repr(C)]
pub struct llmr_infer_request {
    pub struct_size: u32,
    pub flags: u32,
    pub request_id: u64,
    pub model_id: *const c_char,
    pub prompt: llmr_str,
    pub max_tokens: u32,
    pub top_k: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
    pub stop: *const llmr_str,
    pub stop_count: usize,
    pub top_logprobs: u32,
    pub constraint: llmr_str,
    pub prompt_tokens: llmr_tokens,
    pub constraint_kind: u32,
}

#[repr(C)]
pub struct llmr_top_logprob {
    pub token_id: i32,
    pub logprob: f32,
    pub text: llmr_str,
}

#[repr(C)]
pub struct llmr_token {
    pub struct_size: u32,
    pub token_id: i32,
    pub text: llmr_str,
    pub logprob: f32,
    pub top_count: u32,
    pub top: *const llmr_top_logprob,
    pub timestamp_ns: u64,
}

pub type llmr_token_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, token: *const llmr_token) -> bool>;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct llmr_infer_result {
    pub struct_size: u32,
    pub finish_reason: u32,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    /// Minor 3: 1 + the index of the stop sequence that ended the generation; 0 otherwise.
    pub stop_index: u32,
    pub prompt_eval_ns: u64,
    pub generation_ns: u64,
}

#[repr(C)]
pub struct llmr_embed_request {
    pub struct_size: u32,
    pub flags: u32,
    pub request_id: u64,
    pub model_id: *const c_char,
    pub inputs: *const llmr_str,
    pub input_count: usize,
    pub token_inputs: *const llmr_tokens,
}

pub type llmr_embedding_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, index: usize, values: *const f32, dim: usize) -> bool>;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct llmr_embed_result {
    pub struct_size: u32,
    pub prompt_tokens: u32,
}

#[repr(C)]
pub struct llmr_transcribe_request {
    pub struct_size: u32,
    pub sample_rate: u32,
    pub request_id: u64,
    pub model_id: *const c_char,
    pub samples: *const f32,
    pub sample_count: usize,
    pub language: *const c_char,
    pub prompt: *const c_char,
    pub temperature: f32,
    // Minor 2.
    pub padding_1_0: u32,
    pub flags: u32,
    pub beam_size: u32,
    pub reserved: u32,
}

#[repr(C)]
pub struct llmr_word {
    pub struct_size: u32,
    pub probability: f32,
    pub start_ms: u64,
    pub end_ms: u64,
    pub text: llmr_str,
}

#[repr(C)]
pub struct llmr_segment {
    pub struct_size: u32,
    pub reserved: u32,
    pub start_ms: u64,
    pub end_ms: u64,
    pub text: llmr_str,
    // Minor 2.
    pub words: *const llmr_word,
    pub word_count: usize,
    pub tokens: *const i32,
    pub token_count: usize,
    pub language: llmr_str,
    pub avg_logprob: f32,
    pub no_speech_prob: f32,
    pub temperature: f32,
    pub reserved2: u32,
}

pub type llmr_segment_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, segment: *const llmr_segment) -> bool>;

#[repr(C)]
pub struct llmr_synthesize_request {
    pub struct_size: u32,
    pub reserved: u32,
    pub request_id: u64,
    pub model_id: *const c_char,
    pub text: llmr_str,
    pub voice: *const c_char,
    pub speed: f32,
}

pub type llmr_audio_fn = Option<
    unsafe extern "C" fn(user_data: *mut c_void, samples: *const f32, sample_count: usize, sample_rate: u32) -> bool,
>;

#[repr(C)]
pub struct llmr_image_request {
    pub struct_size: u32,
    pub width: u32,
    pub height: u32,
    pub steps: u32,
    pub request_id: u64,
    pub model_id: *const c_char,
    pub prompt: llmr_str,
    pub negative_prompt: llmr_str,
    pub guidance_scale: f32,
    pub count: u32,
    pub seed: u64,
    pub seed_set: u32,
}

pub type llmr_image_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        index: u32,
        pixels: *const u8,
        width: u32,
        height: u32,
        channels: u32,
    ) -> bool,
>;

// Function pointer types of the exports (the `*_fn` typedefs of the header).
pub type llmr_engine_get_info_fn = unsafe extern "C" fn() -> *const llmr_engine_info;
pub type llmr_engine_create_fn =
    unsafe extern "C" fn(config: *const llmr_engine_config, out: *mut *mut llmr_engine) -> llmr_status;
pub type llmr_engine_destroy_fn = unsafe extern "C" fn(engine: *mut llmr_engine) -> llmr_status;
pub type llmr_engine_load_model_fn =
    unsafe extern "C" fn(engine: *mut llmr_engine, desc: *const llmr_model_desc) -> llmr_status;
pub type llmr_engine_unload_model_fn =
    unsafe extern "C" fn(engine: *mut llmr_engine, model_id: *const c_char) -> llmr_status;
pub type llmr_engine_model_info_fn = unsafe extern "C" fn(
    engine: *mut llmr_engine,
    model_id: *const c_char,
    write: llmr_write_fn,
    user_data: *mut c_void,
) -> llmr_status;
pub type llmr_engine_tokenize_fn = unsafe extern "C" fn(
    engine: *mut llmr_engine,
    model_id: *const c_char,
    text: llmr_str,
    flags: u32,
    tokens: *mut i32,
    capacity: usize,
    count: *mut usize,
) -> llmr_status;
pub type llmr_engine_infer_fn = unsafe extern "C" fn(
    engine: *mut llmr_engine,
    request: *const llmr_infer_request,
    on_token: llmr_token_fn,
    user_data: *mut c_void,
    result: *mut llmr_infer_result,
) -> llmr_status;
pub type llmr_engine_embed_fn = unsafe extern "C" fn(
    engine: *mut llmr_engine,
    request: *const llmr_embed_request,
    on_embedding: llmr_embedding_fn,
    user_data: *mut c_void,
    result: *mut llmr_embed_result,
) -> llmr_status;
pub type llmr_engine_transcribe_fn = unsafe extern "C" fn(
    engine: *mut llmr_engine,
    request: *const llmr_transcribe_request,
    on_segment: llmr_segment_fn,
    user_data: *mut c_void,
) -> llmr_status;
pub type llmr_engine_synthesize_fn = unsafe extern "C" fn(
    engine: *mut llmr_engine,
    request: *const llmr_synthesize_request,
    on_audio: llmr_audio_fn,
    user_data: *mut c_void,
) -> llmr_status;
pub type llmr_engine_generate_image_fn = unsafe extern "C" fn(
    engine: *mut llmr_engine,
    request: *const llmr_image_request,
    on_image: llmr_image_fn,
    user_data: *mut c_void,
) -> llmr_status;
pub type llmr_engine_cancel_fn = unsafe extern "C" fn(engine: *mut llmr_engine, request_id: u64) -> llmr_status;
pub type llmr_engine_get_metrics_fn =
    unsafe extern "C" fn(engine: *mut llmr_engine, write: llmr_write_fn, user_data: *mut c_void) -> llmr_status;
pub type llmr_engine_set_config_fn = unsafe extern "C" fn(
    engine: *mut llmr_engine,
    model_id: *const c_char,
    key: *const c_char,
    value_json: *const c_char,
) -> llmr_status;
pub type llmr_engine_last_error_fn = unsafe extern "C" fn(engine: *const llmr_engine) -> *const c_char;

/// Names of the exported symbols, NUL-terminated for dlsym. Every ABI 1.0 plugin exports all.
pub mod symbols {
    pub const GET_INFO: &[u8] = b"llmr_engine_get_info\0";
    pub const CREATE: &[u8] = b"llmr_engine_create\0";
    pub const DESTROY: &[u8] = b"llmr_engine_destroy\0";
    pub const LOAD_MODEL: &[u8] = b"llmr_engine_load_model\0";
    pub const UNLOAD_MODEL: &[u8] = b"llmr_engine_unload_model\0";
    pub const MODEL_INFO: &[u8] = b"llmr_engine_model_info\0";
    pub const TOKENIZE: &[u8] = b"llmr_engine_tokenize\0";
    pub const INFER: &[u8] = b"llmr_engine_infer\0";
    pub const EMBED: &[u8] = b"llmr_engine_embed\0";
    pub const TRANSCRIBE: &[u8] = b"llmr_engine_transcribe\0";
    pub const SYNTHESIZE: &[u8] = b"llmr_engine_synthesize\0";
    pub const GENERATE_IMAGE: &[u8] = b"llmr_engine_generate_image\0";
    pub const CANCEL: &[u8] = b"llmr_engine_cancel\0";
    pub const GET_METRICS: &[u8] = b"llmr_engine_get_metrics\0";
    pub const SET_CONFIG: &[u8] = b"llmr_engine_set_config\0";
    pub const LAST_ERROR: &[u8] = b"llmr_engine_last_error\0";
}
