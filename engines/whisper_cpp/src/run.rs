//! One transcription: the decoding parameters from the request, segments streamed to the host
//! from whisper.cpp's new-segment callback, and cancellation through its abort callback.

use crate::model::WhisperModel;
use llmr_engine_sdk::{EngineError, ErrorCode, Segment, SegmentSink, TranscribeRequest, Word};
use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use whisper_rs::{FullParams, SamplingStrategy};
use whisper_rs_sys as sys;

/// Whisper's own fallback: decode again this much hotter when a segment looks like a failed
/// decode (too repetitive or too unlikely), up to 1.0.
const TEMPERATURE_STEP: f32 = 0.2;
/// Candidates per hot decode (whisper.cpp's and OpenAI's default `best_of`).
const BEST_OF: i32 = 5;
const MAX_BEAMS: u32 = 16;

/// What the callbacks share with the decoding thread.
struct Run<'a> {
    sink: &'a mut SegmentSink,
    cancel: &'a AtomicBool,
    words: bool,
    temperature: f32,
    /// A panic in the host's callback, re-raised after whisper.cpp returns.
    panic: Option<Box<dyn std::any::Any + Send>>,
}

fn unsupported(message: String) -> EngineError {
    EngineError::new(ErrorCode::Unsupported, message)
}

/// Refuses what this model cannot do before any work: whisper.cpp itself would quietly
/// transcribe English instead.
fn check(model: &WhisperModel, request: &TranscribeRequest<'_>) -> Result<(), EngineError> {
    if request.sample_rate != sys::WHISPER_SAMPLE_RATE {
        return Err(unsupported(format!(
            "audio at {} Hz; whisper.cpp hears {} Hz mono",
            request.sample_rate,
            sys::WHISPER_SAMPLE_RATE
        )));
    }
    if let Some(lang) = request.language {
        if !model.multilingual && lang != "en" {
            return Err(unsupported(format!("language `{lang}`: this model is English-only")));
        }
        if model.multilingual && whisper_rs::get_lang_id(lang).is_none() {
            return Err(unsupported(format!("language `{lang}` is not one Whisper knows")));
        }
    }
    if request.translate && !model.multilingual {
        return Err(unsupported("translation needs a multilingual model; this one is English-only".into()));
    }
    if request.beam_size > MAX_BEAMS {
        return Err(unsupported(format!("beam size {} is more than {MAX_BEAMS}", request.beam_size)));
    }
    if !(0.0..=1.0).contains(&request.temperature) {
        return Err(unsupported(format!("temperature {} is outside 0..=1", request.temperature)));
    }
    Ok(())
}

pub fn transcribe(
    model: &WhisperModel,
    request: &TranscribeRequest<'_>,
    threads: u32,
    cancel: &AtomicBool,
    sink: &mut SegmentSink,
) -> Result<(), EngineError> {
    check(model, request)?;
    if request.samples.is_empty() {
        return Ok(()); // nothing heard: no segments (whisper.cpp calls an empty buffer an error)
    }
    let strategy = if request.beam_size > 1 {
        SamplingStrategy::BeamSearch { beam_size: request.beam_size as i32, patience: -1.0 }
    } else {
        SamplingStrategy::Greedy { best_of: BEST_OF }
    };
    let mut params = FullParams::new(strategy);
    params.set_n_threads(threads as i32);
    params.set_translate(request.translate);
    // whisper.cpp's default language is English, which an English-only model always gets
    // ("auto" would run language detection on it). whisper-rs leaks the few bytes of a language
    // it is given, so only a multilingual model's requests set one (NULL: detect).
    if model.multilingual {
        params.set_language(request.language);
    }
    if let Some(prompt) = request.prompt.filter(|p| !p.is_empty()) {
        params.set_initial_prompt(prompt);
    }
    params.set_temperature(request.temperature);
    // OpenAI's rule: temperature 0 lets the model heat up where it fails; a set one is kept.
    params.set_temperature_inc(if request.temperature == 0.0 { TEMPERATURE_STEP } else { 0.0 });
    params.set_token_timestamps(request.word_timestamps);
    params.set_print_special(false);
    params.set_print_progress(false);
    params.set_print_realtime(false);
    params.set_print_timestamps(false);

    let mut run = Run { sink, cancel, words: request.word_timestamps, temperature: request.temperature, panic: None };
    // SAFETY: `run` outlives `state.full`, the only call that invokes the callbacks, and both
    // callbacks run on this thread.
    unsafe {
        params.set_new_segment_callback(Some(on_new_segments));
        params.set_new_segment_callback_user_data(&mut run as *mut Run as *mut c_void);
        params.set_abort_callback(Some(should_abort));
        params.set_abort_callback_user_data(cancel as *const AtomicBool as *mut c_void);
    }
    let mut state = model.state()?;
    let outcome = state.full(params, request.samples);
    if let Some(panic) = run.panic.take() {
        std::panic::resume_unwind(panic);
    }
    if cancel.load(Ordering::Relaxed) {
        return Err(EngineError::cancelled());
    }
    outcome.map_err(|e| EngineError::internal(format!("whisper.cpp failed: {e}")))
}

unsafe extern "C" fn should_abort(user_data: *mut c_void) -> bool {
    (*(user_data as *const AtomicBool)).load(Ordering::Relaxed)
}

unsafe extern "C" fn on_new_segments(
    ctx: *mut sys::whisper_context,
    state: *mut sys::whisper_state,
    n_new: i32,
    user_data: *mut c_void,
) {
    let run = &mut *(user_data as *mut Run);
    if run.panic.is_some() || run.cancel.load(Ordering::Relaxed) {
        return;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let total = sys::whisper_full_n_segments_from_state(state);
        for i in (total - n_new).max(0)..total {
            // A cancel from another thread stops the rest of this batch too (a 30 s window
            // finishes several segments at once).
            if run.cancel.load(Ordering::Relaxed) {
                return;
            }
            let read = read_segment(ctx, state, i, run.words);
            let segment = Segment {
                start_ms: read.start_ms,
                end_ms: read.end_ms,
                text: &read.text,
                words: &read.words,
                tokens: &read.tokens,
                language: read.language,
                avg_logprob: read.avg_logprob,
                no_speech_prob: read.no_speech_prob,
                temperature: run.temperature,
            };
            if !run.sink.emit(&segment) {
                run.cancel.store(true, Ordering::Relaxed);
                return;
            }
        }
    }));
    if let Err(panic) = outcome {
        run.panic = Some(panic);
        run.cancel.store(true, Ordering::Relaxed);
    }
}

/// A segment copied out of whisper.cpp's state.
struct ReadSegment {
    start_ms: u64,
    end_ms: u64,
    text: String,
    words: Vec<Word>,
    tokens: Vec<i32>,
    language: &'static str,
    avg_logprob: f32,
    no_speech_prob: f32,
}

/// whisper.cpp's timestamps count 10 ms steps.
fn centis_to_ms(t: i64) -> u64 {
    t.max(0) as u64 * 10
}

unsafe fn cstr_bytes<'a>(ptr: *const std::ffi::c_char) -> &'a [u8] {
    if ptr.is_null() {
        &[]
    } else {
        CStr::from_ptr(ptr).to_bytes()
    }
}

unsafe fn read_segment(
    ctx: *mut sys::whisper_context,
    state: *mut sys::whisper_state,
    i: i32,
    with_words: bool,
) -> ReadSegment {
    let eot = sys::whisper_token_eot(ctx);
    let lang_id = sys::whisper_full_lang_id_from_state(state);
    let language = whisper_rs::get_lang_str(lang_id).unwrap_or("");
    let mut tokens = Vec::new();
    let mut logprob_sum = 0.0f32;
    let mut words: Vec<Word> = Vec::new();
    // Bytes of the word being built (a token may end mid-character), its probabilities.
    let mut word_bytes: Vec<u8> = Vec::new();
    let mut word_probs: Vec<f32> = Vec::new();
    let flush = |bytes: &mut Vec<u8>, probs: &mut Vec<f32>, words: &mut Vec<Word>, end: u64| {
        if !bytes.is_empty() {
            if let Some(w) = words.last_mut().filter(|w| w.text.is_empty()) {
                w.text = String::from_utf8_lossy(bytes).into_owned();
                w.end_ms = end.max(w.start_ms);
                w.probability = probs.iter().sum::<f32>() / probs.len().max(1) as f32;
            }
        }
        bytes.clear();
        probs.clear();
    };
    let mut last_end = 0;
    for j in 0..sys::whisper_full_n_tokens_from_state(state, i) {
        let data = sys::whisper_full_get_token_data_from_state(state, i, j);
        if data.id >= eot {
            continue; // timestamps, language and task tokens: not text
        }
        tokens.push(data.id);
        logprob_sum += data.plog;
        if !with_words {
            continue;
        }
        let piece = cstr_bytes(sys::whisper_full_get_token_text_from_state(ctx, state, i, j));
        // A word starts at a token beginning with a space (byte-level BPE marks word starts so).
        if piece.first() == Some(&b' ') || words.is_empty() {
            flush(&mut word_bytes, &mut word_probs, &mut words, last_end);
            words.push(Word { start_ms: centis_to_ms(data.t0), ..Word::default() });
        }
        word_bytes.extend_from_slice(piece);
        word_probs.push(data.p);
        last_end = centis_to_ms(data.t1);
    }
    flush(&mut word_bytes, &mut word_probs, &mut words, last_end);
    words.retain(|w| !w.text.trim().is_empty());
    ReadSegment {
        start_ms: centis_to_ms(sys::whisper_full_get_segment_t0_from_state(state, i)),
        end_ms: centis_to_ms(sys::whisper_full_get_segment_t1_from_state(state, i)),
        text: String::from_utf8_lossy(cstr_bytes(sys::whisper_full_get_segment_text_from_state(state, i))).into_owned(),
        avg_logprob: if tokens.is_empty() { 0.0 } else { logprob_sum / tokens.len() as f32 },
        tokens,
        words,
        language,
        no_speech_prob: sys::whisper_full_get_segment_no_speech_prob_from_state(state, i),
    }
}
