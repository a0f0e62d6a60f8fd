//! The generic bodies of the C exports. `export_engine!` instantiates them for one `Engine` type.
//!
//! Each body runs behind `guard`, which catches panics (a panic becomes `LLMR_ERR_INTERNAL` with
//! the panic message as last error) so that no unwind ever crosses into the host.

use crate::types::*;
use crate::{Engine, EngineError, ErrorCode};
use llmr_engine_abi as abi;
use llmr_engine_types::{Constraint, Format, Sampling};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// What an `llmr_engine*` points to.
struct Instance<E> {
    /// Unique per instance, so a later instance at the same address never sees an old error.
    id: u64,
    engine: E,
}

static NEXT_INSTANCE_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Last error per instance id (0 = `create`), for this thread, as the header specifies.
    static LAST_ERRORS: RefCell<HashMap<u64, CString>> = RefCell::new(HashMap::new());
}

fn set_last_error(instance_id: u64, message: &str) {
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERRORS.with(|m| m.borrow_mut().insert(instance_id, c));
}

/// Runs `body`, turning an `Err` or a panic into a status plus a last-error message.
fn guard(instance_id: u64, body: impl FnOnce() -> Result<(), EngineError>) -> abi::llmr_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => abi::LLMR_OK,
        Ok(Err(e)) => {
            set_last_error(instance_id, &e.message);
            e.code.status()
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".into());
            set_last_error(instance_id, &format!("engine panicked: {what}"));
            abi::LLMR_ERR_INTERNAL
        }
    }
}

/// The sizes of the structs that grew after 1.0, as 1.0 hosts send them: minor 1's fields start
/// where 1.0's struct ended (the header's rule), so their first field's offset is the 1.0 size.
const V1_0_INFER_REQUEST: usize = std::mem::offset_of!(abi::llmr_infer_request, constraint);
/// Minor 2 named the 1.0 transcribe request's trailing padding, so its new fields start after it.
const V1_0_TRANSCRIBE_REQUEST: usize = std::mem::offset_of!(abi::llmr_transcribe_request, flags);
const V1_0_EMBED_REQUEST: usize = std::mem::offset_of!(abi::llmr_embed_request, token_inputs);

fn bad_arg(what: &str) -> EngineError {
    EngineError::internal(format!("invalid argument: {what}"))
}

/// Copies a host struct that starts with `struct_size` into a full, zero-initialised `T`:
/// fields beyond the host's size read as zero (the header's compatibility rule). A struct smaller
/// than ABI 1.0's (`v1_0_size`: every 1.0 field is required) is refused.
///
/// SAFETY: `ptr` is NULL or points to at least `struct_size` readable bytes; `T` is a `repr(C)`
/// ABI struct for which all-zero bytes are a valid value.
unsafe fn read_sized<T>(ptr: *const T, name: &str, v1_0_size: usize) -> Result<T, EngineError> {
    if ptr.is_null() {
        return Err(bad_arg(&format!("`{name}` is NULL")));
    }
    let size = *(ptr as *const u32) as usize;
    let full = std::mem::size_of::<T>();
    if size < v1_0_size {
        return Err(EngineError::new(
            ErrorCode::AbiMismatch,
            format!("`{name}.struct_size` is {size}, ABI 1.0 needs at least {v1_0_size}"),
        ));
    }
    let mut out = std::mem::MaybeUninit::<T>::zeroed();
    std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr() as *mut u8, full.min(size));
    Ok(out.assume_init())
}

/// Writes `value` into a host result struct, no further than the host's `struct_size`.
///
/// SAFETY: `ptr` is NULL or points to a writable struct whose first field is `struct_size`.
unsafe fn write_sized<T>(ptr: *mut T, value: &T) {
    if ptr.is_null() {
        return;
    }
    let size = (*(ptr as *const u32) as usize).min(std::mem::size_of::<T>());
    let keep = *(ptr as *const u32);
    std::ptr::copy_nonoverlapping(value as *const T as *const u8, ptr as *mut u8, size);
    *(ptr as *mut u32) = keep;
}

unsafe fn opt_cstr<'a>(ptr: *const c_char, name: &str) -> Result<Option<&'a str>, EngineError> {
    if ptr.is_null() {
        return Ok(None);
    }
    CStr::from_ptr(ptr).to_str().map(Some).map_err(|_| bad_arg(&format!("`{name}` is not valid UTF-8")))
}

unsafe fn req_cstr<'a>(ptr: *const c_char, name: &str) -> Result<&'a str, EngineError> {
    opt_cstr(ptr, name)?.ok_or_else(|| bad_arg(&format!("`{name}` is NULL")))
}

unsafe fn abi_str<'a>(s: abi::llmr_str, name: &str) -> Result<&'a str, EngineError> {
    if s.len == 0 {
        return Ok("");
    }
    if s.ptr.is_null() {
        return Err(bad_arg(&format!("`{name}.ptr` is NULL with length {}", s.len)));
    }
    std::str::from_utf8(std::slice::from_raw_parts(s.ptr as *const u8, s.len))
        .map_err(|_| bad_arg(&format!("`{name}` is not valid UTF-8")))
}

unsafe fn abi_str_array<'a>(ptr: *const abi::llmr_str, count: usize, name: &str) -> Result<Vec<&'a str>, EngineError> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() {
        return Err(bad_arg(&format!("`{name}` is NULL with count {count}")));
    }
    std::slice::from_raw_parts(ptr, count)
        .iter()
        .enumerate()
        .map(|(i, s)| abi_str(*s, &format!("{name}[{i}]")))
        .collect()
}

/// Borrowed token ids (`None` when empty).
unsafe fn abi_tokens<'a>(t: abi::llmr_tokens, name: &str) -> Result<Option<&'a [i32]>, EngineError> {
    if t.count == 0 {
        return Ok(None);
    }
    if t.ids.is_null() {
        return Err(bad_arg(&format!("`{name}` is NULL with count {}", t.count)));
    }
    Ok(Some(std::slice::from_raw_parts(t.ids, t.count)))
}

fn parse_json(text: Option<&str>, name: &str) -> Result<serde_json::Value, EngineError> {
    match text {
        None => Ok(serde_json::Value::Null),
        Some(t) => serde_json::from_str(t).map_err(|e| bad_arg(&format!("`{name}` is not JSON: {e}"))),
    }
}

unsafe fn instance<'a, E>(engine: *const abi::llmr_engine) -> Result<&'a Instance<E>, EngineError> {
    (engine as *const Instance<E>).as_ref().ok_or_else(|| bad_arg("`engine` is NULL"))
}

/// Instance id for error bookkeeping, 0 for NULL.
unsafe fn instance_id<E>(engine: *const abi::llmr_engine) -> u64 {
    (engine as *const Instance<E>).as_ref().map_or(0, |i| i.id)
}

fn write_json(value: &serde_json::Value, write: abi::llmr_write_fn, user_data: *mut c_void) -> Result<(), EngineError> {
    let write = write.ok_or_else(|| bad_arg("`write` is NULL"))?;
    let text = value.to_string();
    // SAFETY: `text` outlives the call.
    unsafe { write(user_data, text.as_ptr().cast(), text.len()) };
    Ok(())
}

pub fn get_info<E: Engine>() -> *const abi::llmr_engine_info {
    // Statics cannot be generic, so each plugin's info block is built once and leaked: it must
    // stay valid until dlclose anyway, and a plugin hosts exactly one Engine type.
    static INFO: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let addr = *INFO.get_or_init(|| {
        let info = E::info();
        let raw = Box::new(abi::llmr_engine_info {
            struct_size: std::mem::size_of::<abi::llmr_engine_info>() as u32,
            abi_major: abi::LLMR_ENGINE_ABI_MAJOR,
            abi_minor: abi::LLMR_ENGINE_ABI_MINOR,
            capabilities: info.capabilities,
            engine_id: info.engine_id.as_ptr(),
            version: info.version.as_ptr(),
        });
        Box::into_raw(raw) as usize
    });
    addr as *const abi::llmr_engine_info
}

pub unsafe fn create<E: Engine>(
    config: *const abi::llmr_engine_config,
    out: *mut *mut abi::llmr_engine,
) -> abi::llmr_status {
    guard(0, || {
        if out.is_null() {
            return Err(bad_arg("`out` is NULL"));
        }
        *out = std::ptr::null_mut();
        let c = read_sized(config, "config", std::mem::size_of::<abi::llmr_engine_config>())?;
        let config = EngineConfig {
            gpu_backend: c.gpu_backend,
            device_id: c.device_id,
            slots: c.slots,
            vram_limit_bytes: c.vram_limit_bytes,
            context_length: c.context_length,
            threads: c.threads,
            logger: Logger::new(c.log_fn, c.log_user_data),
            device_name: opt_cstr(c.device_name, "config.device_name")?.map(str::to_owned),
            device_memory_total_bytes: c.device_memory_total_bytes,
            device_memory_free_bytes: c.device_memory_free_bytes,
            host_memory_total_bytes: c.host_memory_total_bytes,
            params: parse_json(opt_cstr(c.params_json, "config.params_json")?, "config.params_json")?,
        };
        let engine = E::create(config)?;
        let id = NEXT_INSTANCE_ID.fetch_add(1, Ordering::Relaxed);
        *out = Box::into_raw(Box::new(Instance { id, engine })) as *mut abi::llmr_engine;
        Ok(())
    })
}

pub unsafe fn destroy<E: Engine>(engine: *mut abi::llmr_engine) -> abi::llmr_status {
    let id = instance_id::<E>(engine);
    let status = guard(id, || {
        if !engine.is_null() {
            drop(Box::from_raw(engine as *mut Instance<E>));
        }
        Ok(())
    });
    if status == abi::LLMR_OK {
        LAST_ERRORS.with(|m| m.borrow_mut().remove(&id));
    }
    status
}

pub unsafe fn load_model<E: Engine>(
    engine: *mut abi::llmr_engine,
    desc: *const abi::llmr_model_desc,
) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || {
        let inst = instance::<E>(engine)?;
        let d = read_sized(desc, "desc", std::mem::size_of::<abi::llmr_model_desc>())?;
        let format = Format::from_abi(d.format).ok_or_else(|| {
            EngineError::new(ErrorCode::Unsupported, format!("model format {} is unknown to this plugin", d.format))
        })?;
        let desc = ModelDesc {
            format,
            model_id: req_cstr(d.model_id, "desc.model_id")?.to_owned(),
            model_dir: PathBuf::from(req_cstr(d.model_dir, "desc.model_dir")?),
            primary_file: PathBuf::from(req_cstr(d.primary_file, "desc.primary_file")?),
            architecture: opt_cstr(d.architecture, "desc.architecture")?.map(str::to_owned),
            quantization: opt_cstr(d.quantization, "desc.quantization")?.map(str::to_owned),
            mmproj_file: opt_cstr(d.mmproj_file, "desc.mmproj_file")?.map(PathBuf::from),
            context_length: d.context_length,
            options: parse_json(opt_cstr(d.options_json, "desc.options_json")?, "desc.options_json")?,
        };
        inst.engine.load_model(desc)
    })
}

pub unsafe fn unload_model<E: Engine>(engine: *mut abi::llmr_engine, model_id: *const c_char) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || instance::<E>(engine)?.engine.unload_model(req_cstr(model_id, "model_id")?))
}

pub unsafe fn model_info<E: Engine>(
    engine: *mut abi::llmr_engine,
    model_id: *const c_char,
    write: abi::llmr_write_fn,
    user_data: *mut c_void,
) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || {
        let info = instance::<E>(engine)?.engine.model_info(req_cstr(model_id, "model_id")?)?;
        let info = serde_json::to_value(&info).map_err(|e| EngineError::internal(format!("model_info: {e}")))?;
        write_json(&info, write, user_data)
    })
}

pub unsafe fn tokenize<E: Engine>(
    engine: *mut abi::llmr_engine,
    model_id: *const c_char,
    text: abi::llmr_str,
    flags: u32,
    tokens: *mut i32,
    capacity: usize,
    count: *mut usize,
) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || {
        let inst = instance::<E>(engine)?;
        if count.is_null() {
            return Err(bad_arg("`count` is NULL"));
        }
        if tokens.is_null() && capacity > 0 {
            return Err(bad_arg("`tokens` is NULL with a non-zero capacity"));
        }
        let ids = inst.engine.tokenize(
            req_cstr(model_id, "model_id")?,
            abi_str(text, "text")?,
            flags & abi::LLMR_INFER_ADD_BOS != 0,
            flags & abi::LLMR_INFER_PARSE_SPECIAL != 0,
        )?;
        *count = ids.len();
        if ids.len() <= capacity {
            std::ptr::copy_nonoverlapping(ids.as_ptr(), tokens, ids.len());
        }
        Ok(())
    })
}

/// The request's constraint; an unknown kind is UNSUPPORTED (a newer host's grammar form).
unsafe fn read_constraint(kind: u32, text: abi::llmr_str) -> Result<Option<Constraint>, EngineError> {
    let text = || abi_str(text, "request.constraint").map(str::to_owned);
    Ok(match kind {
        abi::LLMR_CONSTRAINT_NONE => None,
        abi::LLMR_CONSTRAINT_JSON_SCHEMA => Some(Constraint::JsonSchema(text()?)),
        abi::LLMR_CONSTRAINT_REGEX => Some(Constraint::Regex(text()?)),
        abi::LLMR_CONSTRAINT_LARK => Some(Constraint::Lark(text()?)),
        other => return Err(EngineError::unsupported(format!("constraint kind {other}"))),
    })
}

pub unsafe fn infer<E: Engine>(
    engine: *mut abi::llmr_engine,
    request: *const abi::llmr_infer_request,
    on_token: abi::llmr_token_fn,
    user_data: *mut c_void,
    result: *mut abi::llmr_infer_result,
) -> abi::llmr_status {
    let mut outcome: Option<InferOutcome> = None;
    let mut status = guard(instance_id::<E>(engine), || {
        let inst = instance::<E>(engine)?;
        let r = read_sized(request, "request", V1_0_INFER_REQUEST)?;
        let req = InferRequest {
            request_id: r.request_id,
            model_id: req_cstr(r.model_id, "request.model_id")?,
            prompt: abi_str(r.prompt, "request.prompt")?,
            sampling: Sampling {
                max_tokens: (r.max_tokens > 0).then_some(r.max_tokens),
                top_k: (r.top_k > 0).then_some(r.top_k),
                temperature: r.temperature,
                top_p: r.top_p,
                min_p: r.min_p,
                repeat_penalty: r.repeat_penalty,
                presence_penalty: r.presence_penalty,
                frequency_penalty: r.frequency_penalty,
                seed: (r.flags & abi::LLMR_INFER_SEED_SET != 0).then_some(r.seed),
                stop: abi_str_array(r.stop, r.stop_count, "request.stop")?.into_iter().map(str::to_owned).collect(),
                logprobs: (r.flags & abi::LLMR_INFER_LOGPROBS != 0).then_some(r.top_logprobs.min(20)),
                constraint: read_constraint(r.constraint_kind, r.constraint)?,
                speculative: r.flags & abi::LLMR_INFER_NO_SPECULATION == 0,
            },
            prompt_tokens: abi_tokens(r.prompt_tokens, "request.prompt_tokens")?,
            parse_special: r.flags & abi::LLMR_INFER_PARSE_SPECIAL != 0,
            add_bos: r.flags & abi::LLMR_INFER_ADD_BOS != 0,
            ignore_eos: r.flags & abi::LLMR_INFER_IGNORE_EOS != 0,
            special_text: r.flags & abi::LLMR_INFER_SPECIAL_TEXT != 0,
        };
        let mut sink = TokenSink::new(on_token, user_data);
        outcome = Some(inst.engine.infer(&req, &mut sink)?);
        Ok(())
    });
    if let Some(o) = outcome {
        let finish_reason = match o.finish_reason {
            FinishReason::Stop => abi::LLMR_FINISH_STOP,
            FinishReason::Length => abi::LLMR_FINISH_LENGTH,
            FinishReason::Cancelled => {
                set_last_error(instance_id::<E>(engine), "request cancelled");
                status = abi::LLMR_ERR_CANCELLED;
                abi::LLMR_FINISH_CANCELLED
            }
        };
        let raw = abi::llmr_infer_result {
            struct_size: std::mem::size_of::<abi::llmr_infer_result>() as u32,
            finish_reason,
            prompt_tokens: o.prompt_tokens,
            completion_tokens: o.completion_tokens,
            cached_tokens: o.cached_tokens,
            stop_index: match (o.finish_reason, o.stop_index) {
                (FinishReason::Stop, Some(i)) => i.saturating_add(1),
                _ => 0,
            },
            prompt_eval_ns: o.prompt_eval_ns,
            generation_ns: o.generation_ns,
        };
        write_sized(result, &raw);
    } else if !result.is_null() {
        let raw = abi::llmr_infer_result {
            struct_size: std::mem::size_of::<abi::llmr_infer_result>() as u32,
            finish_reason: if status == abi::LLMR_ERR_CANCELLED {
                abi::LLMR_FINISH_CANCELLED
            } else {
                abi::LLMR_FINISH_ERROR
            },
            ..Default::default()
        };
        write_sized(result, &raw);
    }
    status
}

pub unsafe fn embed<E: Engine>(
    engine: *mut abi::llmr_engine,
    request: *const abi::llmr_embed_request,
    on_embedding: abi::llmr_embedding_fn,
    user_data: *mut c_void,
    result: *mut abi::llmr_embed_result,
) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || {
        let inst = instance::<E>(engine)?;
        let r = read_sized(request, "request", V1_0_EMBED_REQUEST)?;
        let req = EmbedRequest {
            request_id: r.request_id,
            model_id: req_cstr(r.model_id, "request.model_id")?,
            inputs: if r.token_inputs.is_null() {
                abi_str_array(r.inputs, r.input_count, "request.inputs")?
            } else {
                Vec::new()
            },
            token_inputs: if r.token_inputs.is_null() {
                None
            } else {
                Some(
                    std::slice::from_raw_parts(r.token_inputs, r.input_count)
                        .iter()
                        .enumerate()
                        .map(|(i, t)| Ok(abi_tokens(*t, &format!("request.token_inputs[{i}]"))?.unwrap_or_default()))
                        .collect::<Result<_, EngineError>>()?,
                )
            },
            normalize: r.flags & abi::LLMR_EMBED_NORMALIZE != 0,
        };
        let mut sink = EmbeddingSink::new(on_embedding, user_data);
        let o = inst.engine.embed(&req, &mut sink)?;
        let raw = abi::llmr_embed_result {
            struct_size: std::mem::size_of::<abi::llmr_embed_result>() as u32,
            prompt_tokens: o.prompt_tokens,
        };
        write_sized(result, &raw);
        Ok(())
    })
}

pub unsafe fn transcribe<E: Engine>(
    engine: *mut abi::llmr_engine,
    request: *const abi::llmr_transcribe_request,
    on_segment: abi::llmr_segment_fn,
    user_data: *mut c_void,
) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || {
        let inst = instance::<E>(engine)?;
        let r = read_sized(request, "request", V1_0_TRANSCRIBE_REQUEST)?;
        if r.samples.is_null() && r.sample_count > 0 {
            return Err(bad_arg("`request.samples` is NULL"));
        }
        let samples = if r.sample_count == 0 { &[][..] } else { std::slice::from_raw_parts(r.samples, r.sample_count) };
        let req = TranscribeRequest {
            request_id: r.request_id,
            model_id: req_cstr(r.model_id, "request.model_id")?,
            samples,
            sample_rate: r.sample_rate,
            language: opt_cstr(r.language, "request.language")?,
            prompt: opt_cstr(r.prompt, "request.prompt")?,
            temperature: r.temperature,
            translate: r.flags & abi::LLMR_TRANSCRIBE_TRANSLATE != 0,
            word_timestamps: r.flags & abi::LLMR_TRANSCRIBE_WORD_TIMESTAMPS != 0,
            beam_size: r.beam_size,
        };
        inst.engine.transcribe(&req, &mut SegmentSink::new(on_segment, user_data))
    })
}

pub unsafe fn synthesize<E: Engine>(
    engine: *mut abi::llmr_engine,
    request: *const abi::llmr_synthesize_request,
    on_audio: abi::llmr_audio_fn,
    user_data: *mut c_void,
) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || {
        let inst = instance::<E>(engine)?;
        let r = read_sized(request, "request", std::mem::size_of::<abi::llmr_synthesize_request>())?;
        let req = SynthesizeRequest {
            request_id: r.request_id,
            model_id: req_cstr(r.model_id, "request.model_id")?,
            text: abi_str(r.text, "request.text")?,
            voice: opt_cstr(r.voice, "request.voice")?,
            speed: if r.speed == 0.0 { 1.0 } else { r.speed },
        };
        inst.engine.synthesize(&req, &mut AudioSink::new(on_audio, user_data))
    })
}

pub unsafe fn generate_image<E: Engine>(
    engine: *mut abi::llmr_engine,
    request: *const abi::llmr_image_request,
    on_image: abi::llmr_image_fn,
    user_data: *mut c_void,
) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || {
        let inst = instance::<E>(engine)?;
        let r = read_sized(request, "request", std::mem::size_of::<abi::llmr_image_request>())?;
        let req = ImageRequest {
            request_id: r.request_id,
            model_id: req_cstr(r.model_id, "request.model_id")?,
            prompt: abi_str(r.prompt, "request.prompt")?,
            negative_prompt: abi_str(r.negative_prompt, "request.negative_prompt")?,
            width: r.width,
            height: r.height,
            steps: (r.steps > 0).then_some(r.steps),
            guidance_scale: (r.guidance_scale > 0.0).then_some(r.guidance_scale),
            count: r.count.max(1),
            seed: (r.seed_set != 0).then_some(r.seed),
        };
        inst.engine.generate_image(&req, &mut ImageSink::new(on_image, user_data))
    })
}

pub unsafe fn cancel<E: Engine>(engine: *mut abi::llmr_engine, request_id: u64) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || instance::<E>(engine)?.engine.cancel(request_id))
}

pub unsafe fn get_metrics<E: Engine>(
    engine: *mut abi::llmr_engine,
    write: abi::llmr_write_fn,
    user_data: *mut c_void,
) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || {
        let metrics = instance::<E>(engine)?.engine.metrics()?;
        write_json(&metrics, write, user_data)
    })
}

pub unsafe fn set_config<E: Engine>(
    engine: *mut abi::llmr_engine,
    model_id: *const c_char,
    key: *const c_char,
    value_json: *const c_char,
) -> abi::llmr_status {
    guard(instance_id::<E>(engine), || {
        let inst = instance::<E>(engine)?;
        let key = req_cstr(key, "key")?;
        let value = parse_json(Some(req_cstr(value_json, "value_json")?), "value_json")?;
        inst.engine.set_config(opt_cstr(model_id, "model_id")?, key, value)
    })
}

pub unsafe fn last_error<E: Engine>(engine: *const abi::llmr_engine) -> *const c_char {
    let id = instance_id::<E>(engine);
    LAST_ERRORS.with(|m| m.borrow().get(&id).map_or(c"".as_ptr(), |s| s.as_ptr()))
}
