//! The echo engine: a complete, deterministic plugin written with `llmr-engine-sdk`.
//!
//! It "generates" the words of its prompt one token at a time, so every behaviour of the ABI
//! (streaming, stop sequences, max_tokens, cancel from the callback or from another thread,
//! logprobs, embeddings, runtime settings, errors) can be exercised without model weights. A
//! prompt containing `PANIC_IN_INFER` panics inside `infer`, to test the panic boundary. The
//! manifest's `chat_template` parameter, when set, is the template its models report (to test
//! how the node reads answers of templates such as reasoning models'). With the parameter
//! `crash_on_demand` set, a prompt containing `LLMR_CRASH_SEGFAULT`, `LLMR_CRASH_ABORT` or
//! `LLMR_HANG` makes `infer` write through an invalid pointer, abort the process, or block
//! forever without progress: the failures an engine worker must contain (issue 16); a model
//! whose id contains one does the same in `load_model`.

use llmr_engine_sdk::text::StopMatcher;
use llmr_engine_sdk::{
    abi, export_engine, serde_json, Capability, EmbedOutcome, EmbedRequest, EmbeddingSink, Engine, EngineConfig,
    EngineError, EngineInfo, ErrorCode, FinishReason, InferOutcome, InferRequest, ModelDesc, ModelInfo, Token,
    TokenSink, TopLogprob,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EMBEDDING_DIM: usize = 64;

pub struct EchoEngine {
    models: Mutex<HashSet<String>>,
    running: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    token_delay_ms: AtomicU64,
    requests_total: AtomicU64,
    tokens_total: AtomicU64,
    started: Instant,
    chat_template: Option<String>,
    crash_on_demand: bool,
    /// The GPU ordinal the host created the instance for (-1: the engine's choice), reported
    /// in its metrics so tests can see where the node placed a model.
    device_id: i32,
}

/// A stable token id for a word (FNV-1a), so tokenize and infer agree.
fn word_id(word: &str) -> i32 {
    let mut h: u32 = 0x811c9dc5;
    for b in word.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x01000193);
    }
    (h % 32_000) as i32 + 2
}

impl EchoEngine {
    fn require_model(&self, model_id: &str) -> Result<(), EngineError> {
        if self.models.lock().unwrap().contains(model_id) {
            Ok(())
        } else {
            Err(EngineError::model_not_loaded(model_id))
        }
    }
}

impl Engine for EchoEngine {
    fn info() -> &'static EngineInfo {
        static INFO: EngineInfo = EngineInfo {
            engine_id: c"echo",
            version: c"0.1.0",
            // Its words are the prompt's text, control-token text included, flag or not: it has no
            // control tokens to write as nothing, so it honours `LLMR_INFER_SPECIAL_TEXT` as is.
            capabilities: abi::LLMR_CAP_TEXT | abi::LLMR_CAP_EMBEDDING | abi::LLMR_CAP_SPECIAL_TEXT,
        };
        &INFO
    }

    fn create(config: EngineConfig) -> Result<Self, EngineError> {
        let delay = config.params.get("token_delay_ms").and_then(|v| v.as_u64()).unwrap_or(0);
        config.logger.info(&format!("echo engine created (slots {}, token delay {delay} ms)", config.slots));
        Ok(EchoEngine {
            models: Mutex::default(),
            running: Mutex::default(),
            token_delay_ms: AtomicU64::new(delay),
            requests_total: AtomicU64::new(0),
            tokens_total: AtomicU64::new(0),
            started: Instant::now(),
            chat_template: config.params.get("chat_template").and_then(|v| v.as_str()).map(str::to_owned),
            crash_on_demand: config.params.get("crash_on_demand").and_then(|v| v.as_bool()).unwrap_or(false),
            device_id: config.device_id,
        })
    }

    fn load_model(&self, desc: ModelDesc) -> Result<(), EngineError> {
        if self.crash_on_demand {
            // A model named so hangs (or crashes) its load: the node's load timeout.
            fail_on_demand(&desc.model_id);
        }
        if !desc.primary_file.is_file() {
            return Err(EngineError::load_failed(format!("model file not found: {}", desc.primary_file.display())));
        }
        if !self.models.lock().unwrap().insert(desc.model_id.clone()) {
            return Err(EngineError::load_failed(format!("model '{}' is already loaded", desc.model_id)));
        }
        Ok(())
    }

    fn unload_model(&self, model_id: &str) -> Result<(), EngineError> {
        if self.models.lock().unwrap().remove(model_id) {
            Ok(())
        } else {
            Err(EngineError::model_not_loaded(model_id))
        }
    }

    fn model_info(&self, model_id: &str) -> Result<ModelInfo, EngineError> {
        self.require_model(model_id)?;
        Ok(ModelInfo {
            architecture: Some("echo".into()),
            context_length: Some(4096),
            vocab_size: Some(32002),
            embedding_length: Some(EMBEDDING_DIM as u32),
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
            pooling: Some("mean".into()),
            chat_template: self.chat_template.clone(),
            capabilities: vec![Capability::Text, Capability::Embedding],
            ..ModelInfo::default()
        })
    }

    fn tokenize(
        &self,
        model_id: &str,
        text: &str,
        add_bos: bool,
        _parse_special: bool,
    ) -> Result<Vec<i32>, EngineError> {
        self.require_model(model_id)?;
        Ok(add_bos.then_some(1).into_iter().chain(text.split_whitespace().map(word_id)).collect())
    }

    fn infer(&self, req: &InferRequest<'_>, sink: &mut TokenSink) -> Result<InferOutcome, EngineError> {
        self.require_model(req.model_id)?;
        if req.prompt.contains("PANIC_IN_INFER") {
            panic!("the echo engine was asked to panic");
        }
        if self.crash_on_demand {
            fail_on_demand(req.prompt);
        }
        let cancelled = Arc::new(AtomicBool::new(false));
        self.running.lock().unwrap().insert(req.request_id, cancelled.clone());
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        let outcome = self.generate(req, sink, &cancelled);
        self.running.lock().unwrap().remove(&req.request_id);
        outcome
    }

    fn embed(&self, req: &EmbedRequest<'_>, sink: &mut EmbeddingSink) -> Result<EmbedOutcome, EngineError> {
        self.require_model(req.model_id)?;
        let mut tokens = 0;
        for (i, input) in req.inputs.iter().enumerate() {
            let mut v = vec![0f32; EMBEDDING_DIM];
            for w in input.split_whitespace() {
                v[word_id(&w.to_lowercase()) as usize % EMBEDDING_DIM] += 1.0;
                tokens += 1;
            }
            if req.normalize {
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                v.iter_mut().for_each(|x| *x /= norm);
            }
            if !sink.emit(i, &v) {
                return Err(EngineError::cancelled());
            }
        }
        Ok(EmbedOutcome { prompt_tokens: tokens })
    }

    fn cancel(&self, request_id: u64) -> Result<(), EngineError> {
        if let Some(flag) = self.running.lock().unwrap().get(&request_id) {
            flag.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    fn metrics(&self) -> Result<serde_json::Value, EngineError> {
        Ok(serde_json::json!({
            "slots_busy": self.running.lock().unwrap().len(),
            "requests_total": self.requests_total.load(Ordering::Relaxed),
            "tokens_generated_total": self.tokens_total.load(Ordering::Relaxed),
            "models": self.models.lock().unwrap().iter().cloned().collect::<Vec<_>>(),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "device_id": self.device_id,
        }))
    }

    fn set_config(&self, _model_id: Option<&str>, key: &str, value: serde_json::Value) -> Result<(), EngineError> {
        match (key, value.as_u64()) {
            ("token_delay_ms", Some(ms)) => {
                self.token_delay_ms.store(ms, Ordering::Relaxed);
                Ok(())
            }
            ("token_delay_ms", None) => Err(EngineError::new(
                ErrorCode::Unsupported,
                format!("`token_delay_ms` takes a non-negative integer, got {value}"),
            )),
            _ => Err(EngineError::new(
                ErrorCode::Unsupported,
                format!("unknown setting `{key}` (known: token_delay_ms)"),
            )),
        }
    }
}

impl EchoEngine {
    fn generate(
        &self,
        req: &InferRequest<'_>,
        sink: &mut TokenSink,
        cancelled: &AtomicBool,
    ) -> Result<InferOutcome, EngineError> {
        let start = Instant::now();
        let words: Vec<&str> = req.prompt.split_whitespace().collect();
        let budget = req.sampling.max_tokens.map_or(words.len(), |m| (m as usize).min(words.len()));
        let delay = Duration::from_millis(self.token_delay_ms.load(Ordering::Relaxed));
        let mut stops = StopMatcher::new(req.sampling.stop.iter().map(String::as_str));
        let mut completion_tokens = 0u32;
        let mut finish = if budget < words.len() { FinishReason::Length } else { FinishReason::Stop };
        let alternatives: Vec<String> = (0..req.sampling.logprobs.unwrap_or(0)).map(|i| format!(" alt{i}")).collect();
        for (i, word) in words[..budget].iter().enumerate() {
            if cancelled.load(Ordering::SeqCst) {
                finish = FinishReason::Cancelled;
                break;
            }
            let piece = if i > 0 { format!(" {word}") } else { word.to_string() };
            completion_tokens += 1;
            self.tokens_total.fetch_add(1, Ordering::Relaxed);
            // Text that may still become a stop sequence is held back; the last token releases it.
            let mut text = stops.push(&piece).to_string();
            if i + 1 == budget {
                text.push_str(stops.finish());
            }
            let top: Vec<TopLogprob<'_>> = alternatives
                .iter()
                .enumerate()
                .map(|(k, t)| TopLogprob { token_id: 100 + k as i32, logprob: -1.0 - k as f32, text: t })
                .collect();
            let token = Token {
                token_id: word_id(word),
                text: &text,
                logprob: if req.sampling.logprobs.is_some() { -0.5 } else { 0.0 },
                top: &top,
                timestamp_ns: start.elapsed().as_nanos() as u64,
            };
            if !sink.emit(&token) {
                finish = FinishReason::Cancelled;
                break;
            }
            if stops.stopped() {
                finish = FinishReason::Stop;
                break;
            }
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
        }
        Ok(InferOutcome {
            finish_reason: finish,
            stop_index: stops.matched().map(|i| i as u32),
            prompt_tokens: words.len() as u32 + u32::from(req.add_bos),
            completion_tokens,
            cached_tokens: 0,
            prompt_eval_ns: 0,
            generation_ns: start.elapsed().as_nanos() as u64,
        })
    }
}

/// The failures of `crash_on_demand`, each as the real thing: a signal from the hardware, an
/// abort, a call that never returns.
fn fail_on_demand(prompt: &str) {
    if prompt.contains("LLMR_CRASH_SEGFAULT") {
        // SAFETY: none, on purpose: address 8 is never mapped, so this store faults (SIGSEGV).
        unsafe { std::ptr::without_provenance_mut::<u64>(8).write_volatile(1) };
    }
    if prompt.contains("LLMR_CRASH_ABORT") {
        std::process::abort();
    }
    if prompt.contains("LLMR_HANG") {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

export_engine!(EchoEngine);
