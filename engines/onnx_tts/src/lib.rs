//! Text-to-speech plugin: Piper (VITS) voices through ONNX Runtime.
//!
//! A voice is `<voice>.onnx` plus `<voice>.onnx.json`. Text becomes IPA phonemes through
//! espeak-ng, clause by clause, grouped into sentences as Piper groups them; each sentence's
//! phoneme ids go through the voice's ONNX model and its audio is handed to the host as soon as
//! it exists, so speech streams sentence by sentence.
//!
//! Both native libraries are opened at run time: ONNX Runtime from the path the host gives (see
//! [`synth::runtime_library`]), espeak-ng from the system. Without them the plugin still loads
//! and answers; loading a voice says what is missing. Engine parameters (manifest
//! `parameters`, all optional, empty = unset):
//! - `onnxruntime_library`: path of libonnxruntime.so (1.31+); `ORT_DYLIB_PATH` wins over it,
//!   and without either the model cache's `onnxruntime/` is used;
//! - `espeak_library`, `espeak_data`: another libespeak-ng and espeak-ng-data than the system's.
//!
//! Both libraries are process-wide: the first instance to load a voice decides which are used.

pub mod espeak;
pub mod phonemize;
pub mod synth;
pub mod voice;

use llmr_engine_sdk::{
    abi, export_engine, serde_json, AudioSink, Capability, Engine, EngineConfig, EngineError, EngineInfo, ErrorCode,
    Format, Logger, ModelDesc, ModelInfo, SynthesizeRequest,
};
use ort::session::RunOptions;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;
use voice::{PhonemeType, VoiceConfig};

/// The architecture name this engine serves (manifest `architectures`).
pub const ARCHITECTURE: &str = "piper";
/// `speed` outside this range is refused rather than clamped: the model's output degrades into
/// noise or a drawl well before.
pub const SPEED_RANGE: (f32, f32) = (0.25, 4.0);
/// A sentence longer than this many phonemes is cut at a word boundary: VITS's cost grows with
/// the input and the first audio would wait for the whole sentence.
const MAX_SENTENCE_PHONEMES: usize = 600;

struct Voice {
    config: VoiceConfig,
    model: synth::VoiceModel,
    file: PathBuf,
    size_bytes: u64,
}

/// A request in flight: cancel flips the flag and stops the ONNX run it may be inside.
struct Running {
    cancelled: AtomicBool,
    options: RunOptions,
}

#[derive(Default)]
struct Stats {
    requests: AtomicU64,
    sentences: AtomicU64,
    audio_samples: AtomicU64,
    /// Sum over sentences of samples / rate, in microseconds (rates may differ per voice).
    audio_us: AtomicU64,
    synthesis_us: AtomicU64,
    errors: AtomicU64,
}

pub struct OnnxTts {
    threads: u32,
    params: serde_json::Value,
    logger: Logger,
    voices: RwLock<HashMap<String, Arc<Voice>>>,
    running: Mutex<HashMap<u64, Arc<Running>>>,
    stats: Stats,
}

fn bad_input(message: String) -> EngineError {
    // The SDK's code for input the client must fix; the node answers it as a 400 naming the field.
    EngineError::new(ErrorCode::Unsupported, message)
}

fn param_path(params: &serde_json::Value, key: &str) -> Option<PathBuf> {
    params.get(key).and_then(|v| v.as_str()).filter(|s| !s.is_empty()).map(PathBuf::from)
}

/// The `.onnx` of a model given as a file, or as a folder holding one voice.
fn model_file(desc: &ModelDesc) -> Result<PathBuf, EngineError> {
    let given = if desc.primary_file.as_os_str().is_empty() { &desc.model_dir } else { &desc.primary_file };
    if given.is_file() {
        return Ok(given.clone());
    }
    if given.is_dir() {
        let onnx: Vec<PathBuf> = std::fs::read_dir(given)
            .map_err(|e| EngineError::load_failed(format!("cannot list {}: {e}", given.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
            .collect();
        return match onnx.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(EngineError::load_failed(format!("no .onnx voice in {}", given.display()))),
            _ => Err(EngineError::load_failed(format!(
                "{} holds {} .onnx files: name the voice's .onnx as the primary file",
                given.display(),
                onnx.len()
            ))),
        };
    }
    Err(EngineError::load_failed(format!("model file not found: {}", given.display())))
}

impl OnnxTts {
    fn voice(&self, model_id: &str) -> Result<Arc<Voice>, EngineError> {
        self.voices.read().unwrap().get(model_id).cloned().ok_or_else(|| EngineError::model_not_loaded(model_id))
    }

    /// `text` as sentences of phonemes in the voice's alphabet.
    fn sentences(&self, voice: &Voice, text: &str) -> Result<Vec<Vec<String>>, EngineError> {
        let sentences = match voice.config.phoneme_type {
            PhonemeType::Text => phonemize::text_sentences(text),
            PhonemeType::Espeak => {
                let clauses = espeak::clauses(&voice.config.espeak_voice, text)
                    .map_err(|e| EngineError::internal(format!("espeak-ng: {e}")))?;
                phonemize::sentences(clauses, &voice.config.vowel_clusters)
            }
        };
        Ok(sentences.into_iter().flat_map(split_long).collect())
    }

    fn synthesize_sentences(
        &self,
        voice: &Voice,
        sentences: &[Vec<String>],
        scales: [f32; 3],
        sid: Option<i64>,
        running: &Running,
        on_audio: &mut dyn FnMut(&[f32], u32) -> bool,
    ) -> Result<(), EngineError> {
        let rate = voice.config.sample_rate;
        for phonemes in sentences {
            if running.cancelled.load(Ordering::SeqCst) {
                return Err(EngineError::cancelled());
            }
            let (ids, missing) = voice.config.phoneme_ids(phonemes);
            if !missing.is_empty() {
                self.logger.debug(&format!("phonemes the voice does not know were left out: {missing:?}"));
            }
            let started = Instant::now();
            let mut audio = voice.model.run(&ids, scales, sid, &running.options).map_err(|e| {
                if running.cancelled.load(Ordering::SeqCst) {
                    EngineError::cancelled()
                } else {
                    EngineError::internal(format!("ONNX Runtime: {e}"))
                }
            })?;
            let took = started.elapsed();
            synth::normalize(&mut audio);
            self.stats.sentences.fetch_add(1, Ordering::Relaxed);
            self.stats.audio_samples.fetch_add(audio.len() as u64, Ordering::Relaxed);
            self.stats.audio_us.fetch_add(audio.len() as u64 * 1_000_000 / rate as u64, Ordering::Relaxed);
            self.stats.synthesis_us.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
            if !on_audio(&audio, rate) {
                return Err(EngineError::cancelled());
            }
        }
        Ok(())
    }

    /// [`Engine::synthesize`] with the audio handed to a closure: each sentence's samples and
    /// rate as soon as they exist; returning false cancels.
    pub fn speak(
        &self,
        req: &SynthesizeRequest<'_>,
        mut on_audio: impl FnMut(&[f32], u32) -> bool,
    ) -> Result<(), EngineError> {
        let voice = self.voice(req.model_id)?;
        if req.text.trim().is_empty() {
            return Err(bad_input("`input` is empty: there is no text to speak".into()));
        }
        let speed = if req.speed == 0.0 { 1.0 } else { req.speed };
        if !(SPEED_RANGE.0..=SPEED_RANGE.1).contains(&speed) {
            return Err(bad_input(format!("`speed` {} is outside {}..{}", req.speed, SPEED_RANGE.0, SPEED_RANGE.1)));
        }
        let sid = voice.config.speaker_id(req.voice).map_err(|e| bad_input(format!("`voice`: {e}")))?;
        let sentences = self.sentences(&voice, req.text)?;
        if sentences.is_empty() {
            return Err(bad_input("`input` has nothing to speak (only punctuation or spaces)".into()));
        }
        let c = &voice.config;
        let scales = [c.noise_scale, c.length_scale / speed, c.noise_w];

        let options = RunOptions::new().map_err(|e| EngineError::internal(format!("ONNX Runtime: {e}")))?;
        let running = Arc::new(Running { cancelled: AtomicBool::new(false), options });
        self.running.lock().unwrap().insert(req.request_id, running.clone());
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let outcome = self.synthesize_sentences(&voice, &sentences, scales, sid, &running, &mut on_audio);
        let mut map = self.running.lock().unwrap();
        // Another request may have reused the id meanwhile; only remove our own entry.
        if map.get(&req.request_id).is_some_and(|r| Arc::ptr_eq(r, &running)) {
            map.remove(&req.request_id);
        }
        drop(map);
        if outcome.as_ref().is_err_and(|e| e.code != ErrorCode::Cancelled) {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }
}

/// Cuts an over-long sentence at spaces so no piece exceeds `MAX_SENTENCE_PHONEMES`.
fn split_long(sentence: Vec<String>) -> Vec<Vec<String>> {
    if sentence.len() <= MAX_SENTENCE_PHONEMES {
        return vec![sentence];
    }
    let mut pieces = Vec::new();
    let mut rest = sentence.as_slice();
    while rest.len() > MAX_SENTENCE_PHONEMES {
        let cut = rest[..MAX_SENTENCE_PHONEMES].iter().rposition(|p| p == " ").filter(|&i| i > 0);
        let at = cut.unwrap_or(MAX_SENTENCE_PHONEMES);
        pieces.push(rest[..at].to_vec());
        rest = &rest[at + usize::from(cut.is_some())..];
    }
    if !rest.is_empty() {
        pieces.push(rest.to_vec());
    }
    pieces
}

impl Engine for OnnxTts {
    fn info() -> &'static EngineInfo {
        static INFO: EngineInfo =
            EngineInfo { engine_id: c"onnx_tts", version: c"0.1.0", capabilities: abi::LLMR_CAP_TTS };
        &INFO
    }

    fn create(config: EngineConfig) -> Result<Self, EngineError> {
        // The native libraries are opened when the first voice loads: an instance without them
        // still answers, and a load says what is missing.
        Ok(OnnxTts {
            threads: config.threads,
            params: config.params,
            logger: config.logger,
            voices: RwLock::default(),
            running: Mutex::default(),
            stats: Stats::default(),
        })
    }

    fn load_model(&self, desc: ModelDesc) -> Result<(), EngineError> {
        if desc.format != Format::Onnx {
            return Err(EngineError::load_failed(format!(
                "model '{}' is {}, this engine reads ONNX Piper voices",
                desc.model_id,
                desc.format.as_str()
            )));
        }
        if self.voices.read().unwrap().contains_key(&desc.model_id) {
            return Err(EngineError::load_failed(format!("model '{}' is already loaded", desc.model_id)));
        }
        let file = model_file(&desc)?;
        let config = VoiceConfig::load(&file).map_err(|e| {
            let code =
                if voice::config_path(&file).is_file() { ErrorCode::ModelCorrupt } else { ErrorCode::LoadFailed };
            EngineError::new(code, e)
        })?;
        if config.phoneme_type == PhonemeType::Espeak {
            let data = param_path(&self.params, "espeak_data");
            let lib = param_path(&self.params, "espeak_library");
            let info = espeak::init(lib.as_deref(), data.as_deref()).map_err(EngineError::load_failed)?;
            espeak::check_voice(&config.espeak_voice).map_err(|e| {
                EngineError::load_failed(format!("voice '{}' needs espeak-ng voice data: {e}", desc.model_id))
            })?;
            self.logger.debug(&format!(
                "espeak-ng {} from {} (data {}, clause punctuation {})",
                info.version,
                info.library.display(),
                info.data_path,
                if info.terminator_api { "from espeak-ng" } else { "read from the text" }
            ));
        }
        let wanted = synth::runtime_library(&self.params)?;
        let (env, loaded) = synth::environment(&wanted)?;
        if loaded != wanted {
            self.logger.warn(&format!(
                "ONNX Runtime is already loaded from {} in this process; {} is not used",
                loaded.display(),
                wanted.display()
            ));
        }
        let model = synth::VoiceModel::load(&env, &file, self.threads, config.num_speakers > 1)?;
        let size_bytes = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        self.logger.info(&format!(
            "loaded voice '{}' from {} ({} Hz, {} speaker(s))",
            desc.model_id,
            file.display(),
            config.sample_rate,
            config.num_speakers
        ));
        let mut voices = self.voices.write().unwrap();
        if voices.contains_key(&desc.model_id) {
            return Err(EngineError::load_failed(format!("model '{}' is already loaded", desc.model_id)));
        }
        voices.insert(desc.model_id, Arc::new(Voice { config, model, file, size_bytes }));
        Ok(())
    }

    fn unload_model(&self, model_id: &str) -> Result<(), EngineError> {
        // Requests still running keep their Arc; the session goes when the last one finishes.
        match self.voices.write().unwrap().remove(model_id) {
            Some(_) => Ok(()),
            None => Err(EngineError::model_not_loaded(model_id)),
        }
    }

    fn model_info(&self, model_id: &str) -> Result<ModelInfo, EngineError> {
        let voice = self.voice(model_id)?;
        let c = &voice.config;
        let mut extra = serde_json::Map::new();
        extra.insert(
            "phoneme_type".into(),
            (if c.phoneme_type == PhonemeType::Espeak { "espeak" } else { "text" }).into(),
        );
        if c.phoneme_type == PhonemeType::Espeak {
            extra.insert("espeak_voice".into(), c.espeak_voice.clone().into());
        }
        extra.insert("num_speakers".into(), c.num_speakers.into());
        extra.insert("threads".into(), self.threads.into());
        extra.insert("file".into(), voice.file.display().to_string().into());
        Ok(ModelInfo {
            architecture: Some(ARCHITECTURE.into()),
            vocab_size: Some(c.phoneme_id_map.values().flatten().max().map_or(0, |&m| m as u32 + 1)),
            size_bytes: Some(voice.size_bytes),
            languages: c.language.iter().cloned().collect(),
            voices: c.voice_names(),
            sample_rate: Some(c.sample_rate),
            capabilities: vec![Capability::Tts],
            extra,
            ..ModelInfo::default()
        })
    }

    /// The phoneme ids the voice would be given for `text`, every sentence's in turn.
    fn tokenize(&self, model_id: &str, text: &str, _add_bos: bool, _special: bool) -> Result<Vec<i32>, EngineError> {
        let voice = self.voice(model_id)?;
        let sentences = self.sentences(&voice, text)?;
        Ok(sentences.iter().flat_map(|s| voice.config.phoneme_ids(s).0).map(|id| id as i32).collect())
    }

    fn synthesize(&self, req: &SynthesizeRequest<'_>, sink: &mut AudioSink) -> Result<(), EngineError> {
        self.speak(req, |samples, rate| sink.emit(samples, rate))
    }

    fn cancel(&self, request_id: u64) -> Result<(), EngineError> {
        if let Some(r) = self.running.lock().unwrap().get(&request_id) {
            r.cancelled.store(true, Ordering::SeqCst);
            // Stops the sentence being synthesized instead of waiting for it.
            let _ = r.options.terminate();
        }
        Ok(())
    }

    fn metrics(&self) -> Result<serde_json::Value, EngineError> {
        let s = &self.stats;
        let audio_s = s.audio_us.load(Ordering::Relaxed) as f64 / 1e6;
        let synth_s = s.synthesis_us.load(Ordering::Relaxed) as f64 / 1e6;
        let mut models: Vec<String> = self.voices.read().unwrap().keys().cloned().collect();
        models.sort();
        Ok(serde_json::json!({
            "models": models,
            "requests_total": s.requests.load(Ordering::Relaxed),
            "requests_running": self.running.lock().unwrap().len(),
            "request_errors_total": s.errors.load(Ordering::Relaxed),
            "sentences_total": s.sentences.load(Ordering::Relaxed),
            "audio_samples_total": s.audio_samples.load(Ordering::Relaxed),
            "audio_seconds_total": audio_s,
            "synthesis_seconds_total": synth_s,
            // Seconds of compute per second of speech; below 1 is faster than real time.
            "real_time_factor": if audio_s > 0.0 { synth_s / audio_s } else { 0.0 },
            "threads": self.threads,
        }))
    }
}

export_engine!(OnnxTts);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_sentences_are_cut_at_spaces() {
        let word: Vec<String> = "abcdefghi".chars().map(String::from).collect();
        let mut sentence = Vec::new();
        for _ in 0..200 {
            sentence.extend(word.iter().cloned());
            sentence.push(" ".into());
        }
        let pieces = split_long(sentence.clone());
        assert!(pieces.len() >= 3, "{}", pieces.len());
        assert!(pieces.iter().all(|p| p.len() <= MAX_SENTENCE_PHONEMES && p.first().is_some_and(|f| f != " ")));
        let total: usize = pieces.iter().map(Vec::len).sum();
        assert_eq!(total + pieces.len() - 1, sentence.len(), "only the spaces at the cuts are dropped");
        // No space at all: cut hard.
        let solid: Vec<String> = (0..1300).map(|_| "a".to_string()).collect();
        assert_eq!(split_long(solid).iter().map(Vec::len).collect::<Vec<_>>(), [600, 600, 100]);
    }
}
