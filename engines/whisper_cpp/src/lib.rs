//! The whisper.cpp plugin: speech to text (and speech in any language to English text) with
//! Whisper models in whisper.cpp's ggml format.
//!
//! One `WhisperContext` per loaded model holds the weights; each request decodes in a
//! `WhisperState` of its own (taken from a small pool, since allocating one costs its KV cache and
//! compute buffers), so requests never share mutable state. Segments reach the host as whisper.cpp
//! finishes them, and a cancel (the host's callback returning false, or `cancel(request_id)`)
//! stops whisper.cpp at its next abort check, inside the encoder as well as between segments.

mod model;
mod run;

use llmr_engine_sdk::{
    abi, export_engine, serde_json, Engine, EngineConfig, EngineError, EngineInfo, ModelDesc, ModelInfo, SegmentSink,
    TranscribeRequest,
};
use model::WhisperModel;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

pub struct WhisperEngine {
    models: RwLock<HashMap<String, Arc<WhisperModel>>>,
    /// Cancel flags of the requests running now, by request id.
    running: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    threads: u32,
    use_gpu: bool,
    stats: Stats,
}

/// Counters for `metrics`: audio heard and the time it took, so the real-time factor shows.
#[derive(Default)]
struct Stats {
    requests: AtomicU64,
    audio_ms: AtomicU64,
    busy_ms: AtomicU64,
}

/// Every core this process may use: whisper.cpp's encoder scales with them.
fn default_threads() -> u32 {
    std::thread::available_parallelism().map_or(4, |n| n.get() as u32)
}

impl WhisperEngine {
    fn model(&self, model_id: &str) -> Result<Arc<WhisperModel>, EngineError> {
        self.models.read().unwrap().get(model_id).cloned().ok_or_else(|| EngineError::model_not_loaded(model_id))
    }
}

impl Engine for WhisperEngine {
    fn info() -> &'static EngineInfo {
        static INFO: EngineInfo =
            EngineInfo { engine_id: c"whisper_cpp", version: c"0.1.0", capabilities: abi::LLMR_CAP_ASR };
        &INFO
    }

    fn create(config: EngineConfig) -> Result<Self, EngineError> {
        // whisper.cpp and ggml print to stderr unless hooked; without a logging backend the hooks
        // drop their lines, and the plugin reports what matters through its own errors.
        whisper_rs::install_logging_hooks();
        let threads = if config.threads > 0 { config.threads } else { default_threads() };
        let use_gpu = config.gpu_backend != abi::LLMR_GPU_CPU;
        config.logger.info(&format!("whisper.cpp engine created ({threads} threads, gpu {use_gpu})"));
        Ok(WhisperEngine {
            models: RwLock::default(),
            running: Mutex::default(),
            threads,
            use_gpu,
            stats: Stats::default(),
        })
    }

    fn load_model(&self, desc: ModelDesc) -> Result<(), EngineError> {
        if self.models.read().unwrap().contains_key(&desc.model_id) {
            return Err(EngineError::load_failed(format!("model '{}' is already loaded", desc.model_id)));
        }
        let model = WhisperModel::load(&desc.primary_file, self.use_gpu)?;
        self.models.write().unwrap().insert(desc.model_id, Arc::new(model));
        Ok(())
    }

    fn unload_model(&self, model_id: &str) -> Result<(), EngineError> {
        match self.models.write().unwrap().remove(model_id) {
            Some(_) => Ok(()),
            None => Err(EngineError::model_not_loaded(model_id)),
        }
    }

    fn model_info(&self, model_id: &str) -> Result<ModelInfo, EngineError> {
        Ok(self.model(model_id)?.info(self.threads))
    }

    fn transcribe(&self, request: &TranscribeRequest<'_>, sink: &mut SegmentSink) -> Result<(), EngineError> {
        let model = self.model(request.model_id)?;
        let cancel = Arc::new(AtomicBool::new(false));
        self.running.lock().unwrap().insert(request.request_id, cancel.clone());
        let started = std::time::Instant::now();
        let outcome = run::transcribe(&model, request, self.threads, &cancel, sink);
        self.running.lock().unwrap().remove(&request.request_id);
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let audio_ms = request.samples.len() as u64 * 1000 / u64::from(request.sample_rate.max(1));
        self.stats.audio_ms.fetch_add(audio_ms, Ordering::Relaxed);
        self.stats.busy_ms.fetch_add(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        outcome
    }

    fn cancel(&self, request_id: u64) -> Result<(), EngineError> {
        if let Some(flag) = self.running.lock().unwrap().get(&request_id) {
            flag.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn metrics(&self) -> Result<serde_json::Value, EngineError> {
        let audio_ms = self.stats.audio_ms.load(Ordering::Relaxed);
        let busy_ms = self.stats.busy_ms.load(Ordering::Relaxed);
        Ok(serde_json::json!({
            "transcriptions_total": self.stats.requests.load(Ordering::Relaxed),
            "audio_seconds_total": audio_ms as f64 / 1000.0,
            "busy_seconds_total": busy_ms as f64 / 1000.0,
            "running": self.running.lock().unwrap().len(),
            "threads": self.threads,
        }))
    }
}

export_engine!(WhisperEngine);
