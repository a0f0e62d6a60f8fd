//! Write an llmr engine plugin in safe Rust.
//!
//! Implement [`Engine`] for a type, then call [`export_engine!`] once in the plugin crate (a
//! `cdylib`). The macro generates every C export of `llmr_engine.h`; each one checks its
//! arguments, applies the struct-size compatibility rule, and runs behind a panic boundary, so a
//! panic inside the engine becomes `LLMR_ERR_INTERNAL` with the panic message as last error and
//! never unwinds into the host. Keep the default `panic = "unwind"` in the plugin's profile.
//!
//! ```ignore
//! struct Echo;
//! impl llmr_engine_sdk::Engine for Echo {
//!     fn info() -> &'static EngineInfo { ... }
//!     fn create(_: EngineConfig) -> Result<Self, EngineError> { Ok(Echo) }
//!     ...
//! }
//! llmr_engine_sdk::export_engine!(Echo);
//! ```

mod error;
#[doc(hidden)]
pub mod ffi;
pub mod text;
mod types;
pub mod vectors;
pub mod worker;

pub use error::{EngineError, ErrorCode};
pub use llmr_engine_abi as abi;
pub use llmr_engine_types::{Capability, Constraint, Format, ModelInfo, Sampling, SamplingDefaults};
pub use serde_json;
pub use types::*;

/// One engine instance. The host may call every method concurrently from many threads (only
/// `Drop` is exclusive), so implementations synchronise internally.
///
/// Methods a plugin does not override answer `ErrorCode::Unsupported`.
pub trait Engine: Send + Sync + Sized + 'static {
    /// Identity reported by `llmr_engine_get_info`; must match the plugin's manifest.json.
    fn info() -> &'static EngineInfo;

    fn create(config: EngineConfig) -> Result<Self, EngineError>;

    fn load_model(&self, desc: ModelDesc) -> Result<(), EngineError>;

    fn unload_model(&self, model_id: &str) -> Result<(), EngineError>;

    /// What the host may know about a loaded model (the keys the header lists).
    fn model_info(&self, model_id: &str) -> Result<ModelInfo, EngineError> {
        let _ = model_id;
        Err(EngineError::unsupported("model_info"))
    }

    fn tokenize(
        &self,
        model_id: &str,
        text: &str,
        add_bos: bool,
        parse_special: bool,
    ) -> Result<Vec<i32>, EngineError> {
        let _ = (model_id, text, add_bos, parse_special);
        Err(EngineError::unsupported("tokenize"))
    }

    /// Generates text, handing each token to `sink` as soon as it is known. When `sink.emit`
    /// returns false, stop and return `FinishReason::Cancelled`.
    fn infer(&self, request: &InferRequest<'_>, sink: &mut TokenSink) -> Result<InferOutcome, EngineError> {
        let _ = (request, sink);
        Err(EngineError::unsupported("text generation"))
    }

    fn embed(&self, request: &EmbedRequest<'_>, sink: &mut EmbeddingSink) -> Result<EmbedOutcome, EngineError> {
        let _ = (request, sink);
        Err(EngineError::unsupported("embeddings"))
    }

    fn transcribe(&self, request: &TranscribeRequest<'_>, sink: &mut SegmentSink) -> Result<(), EngineError> {
        let _ = (request, sink);
        Err(EngineError::unsupported("transcription"))
    }

    fn synthesize(&self, request: &SynthesizeRequest<'_>, sink: &mut AudioSink) -> Result<(), EngineError> {
        let _ = (request, sink);
        Err(EngineError::unsupported("speech synthesis"))
    }

    fn generate_image(&self, request: &ImageRequest<'_>, sink: &mut ImageSink) -> Result<(), EngineError> {
        let _ = (request, sink);
        Err(EngineError::unsupported("image generation"))
    }

    /// Stops a running request. Unknown or finished ids are not an error.
    fn cancel(&self, request_id: u64) -> Result<(), EngineError> {
        let _ = request_id;
        Err(EngineError::unsupported("cancel"))
    }

    fn metrics(&self) -> Result<serde_json::Value, EngineError> {
        Ok(serde_json::json!({}))
    }

    /// Changes a runtime setting; `model_id` `None` means the whole instance.
    fn set_config(&self, model_id: Option<&str>, key: &str, value: serde_json::Value) -> Result<(), EngineError> {
        let _ = (model_id, value);
        Err(EngineError::new(ErrorCode::Unsupported, format!("unknown setting `{key}`")))
    }
}

/// Generates the C exports of `llmr_engine.h` for an [`Engine`] type. Call it once per plugin.
#[macro_export]
macro_rules! export_engine {
    ($engine:ty) => {
        const _: () = {
            use ::std::ffi::{c_char, c_void};
            use $crate::abi;
            use $crate::ffi;

            #[no_mangle]
            pub extern "C" fn llmr_engine_get_info() -> *const abi::llmr_engine_info {
                ffi::get_info::<$engine>()
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_create(
                config: *const abi::llmr_engine_config,
                out: *mut *mut abi::llmr_engine,
            ) -> abi::llmr_status {
                ffi::create::<$engine>(config, out)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_destroy(engine: *mut abi::llmr_engine) -> abi::llmr_status {
                ffi::destroy::<$engine>(engine)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_load_model(
                engine: *mut abi::llmr_engine,
                desc: *const abi::llmr_model_desc,
            ) -> abi::llmr_status {
                ffi::load_model::<$engine>(engine, desc)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_unload_model(
                engine: *mut abi::llmr_engine,
                model_id: *const c_char,
            ) -> abi::llmr_status {
                ffi::unload_model::<$engine>(engine, model_id)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_model_info(
                engine: *mut abi::llmr_engine,
                model_id: *const c_char,
                write: abi::llmr_write_fn,
                user_data: *mut c_void,
            ) -> abi::llmr_status {
                ffi::model_info::<$engine>(engine, model_id, write, user_data)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_tokenize(
                engine: *mut abi::llmr_engine,
                model_id: *const c_char,
                text: abi::llmr_str,
                flags: u32,
                tokens: *mut i32,
                capacity: usize,
                count: *mut usize,
            ) -> abi::llmr_status {
                ffi::tokenize::<$engine>(engine, model_id, text, flags, tokens, capacity, count)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_infer(
                engine: *mut abi::llmr_engine,
                request: *const abi::llmr_infer_request,
                on_token: abi::llmr_token_fn,
                user_data: *mut c_void,
                result: *mut abi::llmr_infer_result,
            ) -> abi::llmr_status {
                ffi::infer::<$engine>(engine, request, on_token, user_data, result)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_embed(
                engine: *mut abi::llmr_engine,
                request: *const abi::llmr_embed_request,
                on_embedding: abi::llmr_embedding_fn,
                user_data: *mut c_void,
                result: *mut abi::llmr_embed_result,
            ) -> abi::llmr_status {
                ffi::embed::<$engine>(engine, request, on_embedding, user_data, result)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_transcribe(
                engine: *mut abi::llmr_engine,
                request: *const abi::llmr_transcribe_request,
                on_segment: abi::llmr_segment_fn,
                user_data: *mut c_void,
            ) -> abi::llmr_status {
                ffi::transcribe::<$engine>(engine, request, on_segment, user_data)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_synthesize(
                engine: *mut abi::llmr_engine,
                request: *const abi::llmr_synthesize_request,
                on_audio: abi::llmr_audio_fn,
                user_data: *mut c_void,
            ) -> abi::llmr_status {
                ffi::synthesize::<$engine>(engine, request, on_audio, user_data)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_generate_image(
                engine: *mut abi::llmr_engine,
                request: *const abi::llmr_image_request,
                on_image: abi::llmr_image_fn,
                user_data: *mut c_void,
            ) -> abi::llmr_status {
                ffi::generate_image::<$engine>(engine, request, on_image, user_data)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_cancel(
                engine: *mut abi::llmr_engine,
                request_id: u64,
            ) -> abi::llmr_status {
                ffi::cancel::<$engine>(engine, request_id)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_get_metrics(
                engine: *mut abi::llmr_engine,
                write: abi::llmr_write_fn,
                user_data: *mut c_void,
            ) -> abi::llmr_status {
                ffi::get_metrics::<$engine>(engine, write, user_data)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_set_config(
                engine: *mut abi::llmr_engine,
                model_id: *const c_char,
                key: *const c_char,
                value_json: *const c_char,
            ) -> abi::llmr_status {
                ffi::set_config::<$engine>(engine, model_id, key, value_json)
            }
            #[no_mangle]
            pub unsafe extern "C" fn llmr_engine_last_error(engine: *const abi::llmr_engine) -> *const c_char {
                ffi::last_error::<$engine>(engine)
            }
        };
    };
}
