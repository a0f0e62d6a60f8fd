//! Speech calls on an [`EngineInstance`]: transcription (segments back) and synthesis (PCM back).

use crate::instance::{abi_str, cstring, lent_bytes, opt_cstring, ptr_or_null, CallbackState, EngineInstance};
use crate::status::{CallError, EngineStatus};
use llmr_engine_abi as abi;
use std::ffi::c_void;

/// A transcription request: mono PCM and how to decode it.
#[derive(Clone, Debug)]
pub struct TranscribeParams<'a> {
    pub request_id: u64,
    pub model_id: &'a str,
    pub samples: &'a [f32],
    pub sample_rate: u32,
    /// ISO 639-1; `None`: the engine detects it.
    pub language: Option<&'a str>,
    pub prompt: Option<&'a str>,
    /// 0: greedy with the engine's temperature fallback; > 0: sample at this temperature.
    pub temperature: f32,
    pub translate: bool,
    pub word_timestamps: bool,
    /// > 1: beam search.
    pub beam_size: u32,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Word {
    pub start_ms: u64,
    pub end_ms: u64,
    pub text: String,
    pub probability: f32,
}

/// One transcribed segment, copied out of the plugin's callback.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Segment {
    pub start_ms: u64,
    pub end_ms: u64,
    pub text: String,
    pub words: Vec<Word>,
    pub tokens: Vec<i32>,
    /// ISO 639-1 code; `None` when the plugin did not say (a 1.0/1.1 plugin never does).
    pub language: Option<String>,
    pub avg_logprob: f32,
    pub no_speech_prob: f32,
    pub temperature: f32,
}

/// A synthesis request.
#[derive(Clone, Debug)]
pub struct SynthesizeParams<'a> {
    pub request_id: u64,
    pub model_id: &'a str,
    pub text: &'a str,
    pub voice: Option<&'a str>,
    /// 1 = normal.
    pub speed: f32,
}

/// Whether the segment the plugin filled (its `struct_size`) reaches past `field`.
macro_rules! has_field {
    ($raw:expr, $field:ident) => {
        ($raw.struct_size as usize)
            >= std::mem::offset_of!(abi::llmr_segment, $field) + std::mem::size_of_val(&$raw.$field)
    };
}

unsafe fn lent_slice<'a, T>(ptr: *const T, count: usize) -> &'a [T] {
    if ptr.is_null() || count == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, count)
    }
}

fn lossy(s: abi::llmr_str) -> String {
    // SAFETY: the plugin lends `s` for the duration of the callback this runs in.
    String::from_utf8_lossy(unsafe { lent_bytes(s) }).into_owned()
}

/// Copies a segment the plugin lent; fields beyond its `struct_size` read as empty.
unsafe fn copy_segment(raw: &abi::llmr_segment) -> Segment {
    let mut segment =
        Segment { start_ms: raw.start_ms, end_ms: raw.end_ms, text: lossy(raw.text), ..Segment::default() };
    if !has_field!(raw, reserved2) {
        return segment;
    }
    segment.words = lent_slice(raw.words, raw.word_count)
        .iter()
        .map(|w| Word { start_ms: w.start_ms, end_ms: w.end_ms, text: lossy(w.text), probability: w.probability })
        .collect();
    segment.tokens = lent_slice(raw.tokens, raw.token_count).to_vec();
    segment.language = Some(lossy(raw.language)).filter(|l| !l.is_empty());
    segment.avg_logprob = raw.avg_logprob;
    segment.no_speech_prob = raw.no_speech_prob;
    segment.temperature = raw.temperature;
    segment
}

unsafe extern "C" fn segment_trampoline<F: FnMut(Segment) -> bool>(
    user_data: *mut c_void,
    segment: *const abi::llmr_segment,
) -> bool {
    let state = &mut *(user_data as *mut CallbackState<F>);
    let Some(raw) = segment.as_ref() else { return true };
    state.call(|f| f(copy_segment(raw)))
}

unsafe extern "C" fn audio_trampoline<F: FnMut(&[f32], u32) -> bool>(
    user_data: *mut c_void,
    samples: *const f32,
    count: usize,
    sample_rate: u32,
) -> bool {
    let state = &mut *(user_data as *mut CallbackState<F>);
    let samples = lent_slice(samples, count);
    state.call(|f| f(samples, sample_rate))
}

impl EngineInstance {
    /// Transcribes `params.samples`, handing each segment to `on_segment` in order (false
    /// cancels). Blocks until the audio is done.
    pub fn transcribe<F>(&self, params: &TranscribeParams<'_>, on_segment: F) -> Result<(), CallError>
    where
        F: FnMut(Segment) -> bool,
    {
        self.require(abi::LLMR_CAP_ASR, "transcription")?;
        // A plugin built before minor 2 reads none of these fields: it would silently transcribe
        // instead of translating, so the request is refused instead.
        let asks_minor_2 = params.translate || params.word_timestamps || params.beam_size > 1;
        if asks_minor_2 && self.plugin().info.abi_minor < 2 {
            return Err(CallError {
                status: EngineStatus::Unsupported,
                message: format!(
                    "engine '{}' (ABI 1.{}) cannot translate, give word timestamps or search beams",
                    self.plugin().info.engine_id,
                    self.plugin().info.abi_minor
                ),
            });
        }
        let model_id = cstring(params.model_id, "model_id")?;
        let language = opt_cstring(params.language, "language")?;
        let prompt = opt_cstring(params.prompt, "prompt")?;
        let mut flags = 0;
        if params.translate {
            flags |= abi::LLMR_TRANSCRIBE_TRANSLATE;
        }
        if params.word_timestamps {
            flags |= abi::LLMR_TRANSCRIBE_WORD_TIMESTAMPS;
        }
        let raw = abi::llmr_transcribe_request {
            struct_size: std::mem::size_of::<abi::llmr_transcribe_request>() as u32,
            sample_rate: params.sample_rate,
            request_id: params.request_id,
            model_id: model_id.as_ptr(),
            samples: params.samples.as_ptr(),
            sample_count: params.samples.len(),
            language: ptr_or_null(&language),
            prompt: ptr_or_null(&prompt),
            temperature: params.temperature,
            padding_1_0: 0,
            flags,
            beam_size: params.beam_size,
            reserved: 0,
        };
        let mut state = CallbackState { f: on_segment, panic: None };
        let status = unsafe {
            (self.plugin().exports.transcribe)(
                self.raw(),
                &raw,
                Some(segment_trampoline::<F>),
                &mut state as *mut CallbackState<F> as *mut c_void,
            )
        };
        let outcome = self.check(status);
        state.resume_panic();
        outcome
    }

    /// Synthesizes `params.text`, handing consecutive PCM chunks (mono, with their sample rate)
    /// to `on_audio` as they are ready (false cancels). Blocks until the text is spoken.
    pub fn synthesize<F>(&self, params: &SynthesizeParams<'_>, on_audio: F) -> Result<(), CallError>
    where
        F: FnMut(&[f32], u32) -> bool,
    {
        self.require(abi::LLMR_CAP_TTS, "speech synthesis")?;
        let model_id = cstring(params.model_id, "model_id")?;
        let voice = opt_cstring(params.voice, "voice")?;
        let raw = abi::llmr_synthesize_request {
            struct_size: std::mem::size_of::<abi::llmr_synthesize_request>() as u32,
            reserved: 0,
            request_id: params.request_id,
            model_id: model_id.as_ptr(),
            text: abi_str(params.text),
            voice: ptr_or_null(&voice),
            speed: params.speed,
        };
        let mut state = CallbackState { f: on_audio, panic: None };
        let status = unsafe {
            (self.plugin().exports.synthesize)(
                self.raw(),
                &raw,
                Some(audio_trampoline::<F>),
                &mut state as *mut CallbackState<F> as *mut c_void,
            )
        };
        let outcome = self.check(status);
        state.resume_panic();
        outcome
    }
}
