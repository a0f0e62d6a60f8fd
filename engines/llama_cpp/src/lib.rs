//! The llama.cpp engine plugin: GGUF text generation with continuous batching and prefix
//! caching, and embeddings, over the llmr engine ABI.
//!
//! Each loaded model gets a scheduler thread that owns its llama.cpp context (see
//! `scheduler.rs`); `infer` tokenizes on the caller's thread, hands the job over, and streams
//! the scheduler's token events into the host callback from the caller's thread.

mod backend;
mod embed;
mod model;
mod sampling;
mod scheduler;
mod settings;

use llama_cpp_2::context::params::LlamaPoolingType;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llmr_constraint::{TokenMask, Vocabulary, VocabularyError};
use llmr_engine_sdk::worker::{relay, spawn_worker, Worker};
use llmr_engine_sdk::{
    abi, checked_token_ids, export_engine, serde_json, Capability, Constraint, EmbedOutcome, EmbedRequest,
    EmbeddingSink, Engine, EngineConfig, EngineError, EngineInfo, ErrorCode, InferOutcome, InferRequest, Logger,
    ModelDesc, ModelInfo, TokenSink,
};
use llmr_kv_policy::Level;
use llmr_sampling::DraftSettings;
use model::ModelMeta;
use scheduler::{Command, Job, Stats};
use settings::{Change, ContextSettings, Eviction, KvType, PolicyChange, StepSettings};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

/// Default slots when the host does not say.
const DEFAULT_SLOTS: u32 = 4;
/// The default context per sequence is the model's training context, capped here: a 32k-token
/// model would otherwise reserve gigabytes of KV cache per slot that nobody asked for.
const DEFAULT_CTX_CAP: u32 = 8192;
const DEFAULT_PREFILL_CHUNK: u32 = 256;
/// A step that reads prompt tokens takes at most about this many times a generating-only step
/// (`llmr_sampling::Pacer`). Measured on 2 cores (bench/RESULTS.md): streams slowed ~4x instead
/// of ~44x while a 2,000-token prompt was read, and that prompt's first token came 2x later.
const DEFAULT_PREFILL_STALL: f64 = 4.0;
/// Host memory per model for saved prefixes (`llmr_sampling::PrefixStore`): hundreds of prompts
/// of a small model, a handful of 1,000-token ones of an 8B (about 128 KiB a token with f16 keys
/// and values).
const DEFAULT_PREFIX_CACHE_MIB: u32 = 512;
/// Context checkpoints per slot (sliding-window models with a window-sized cache): where the last
/// prompts ended. A follow-up turn resumes from the live cache; a checkpoint serves one that
/// parts from it further back than the window (a client that edits or drops an earlier answer,
/// a template that drops the last answer's thinking).
const DEFAULT_CTX_CHECKPOINTS: u32 = 2;

struct LoadedModel {
    model: Arc<LlamaModel>,
    meta: ModelMeta,
    quantization: Option<String>,
    settings: Mutex<ContextSettings>,
    /// Middle eviction (`settings::Eviction`): a request may then ask for more tokens than its
    /// context has room for.
    eviction: Mutex<Option<Eviction>>,
    /// Whether llama.cpp can move this model's cached positions (`model::can_shift`).
    shiftable: bool,
    /// None for encoder-only models, which cannot generate.
    scheduler: Mutex<Option<Worker<Command>>>,
    embedder: Mutex<Option<Worker<embed::EmbedJob>>>,
    stats: Arc<Stats>,
    /// The vocabulary compiled for constrained decoding, on first use (a walk of every token
    /// that models never asked for structured output should not pay at load).
    grammar: OnceLock<Result<Vocabulary, VocabularyError>>,
}

/// Why a dynamic KV policy runs without middle eviction on a model.
const NO_EVICTION: &str = "llama.cpp cannot move this model's cached positions (a recurrent state, multi-axis positions, or a window-sized sliding cache: `swa_full: true` makes one full-size): the KV policy runs without middle eviction";

/// `eviction` where llama.cpp can move model `id`'s cached positions (`shiftable`, with its
/// sliding window `n_swa` and `swa_full` as given), else `None`, said in the log (`kv_eviction`
/// in the metrics is then null).
fn runnable_eviction(
    id: &str,
    eviction: Option<Eviction>,
    (shiftable, n_swa, swa_full): (bool, u32, bool),
    logger: Logger,
) -> Option<Eviction> {
    if eviction.is_some() && !model::evicts_middle(shiftable, n_swa, swa_full) {
        logger.warn(&format!("{id}: {NO_EVICTION}"));
        return None;
    }
    eviction
}

impl LoadedModel {
    /// What of policy change `p` this model can run: all of it but middle eviction where
    /// llama.cpp cannot move its positions.
    fn doable(&self, id: &str, mut p: PolicyChange, logger: Logger) -> PolicyChange {
        let cache = (self.shiftable, model::sliding_window(&self.model), self.settings.lock().unwrap().swa_full);
        p.eviction = runnable_eviction(id, p.eviction, cache, logger);
        p
    }

    /// A request's constraint compiled against the model's vocabulary. Either failing is
    /// UNSUPPORTED with the reason: the node answers 400 on the constraint's field.
    fn compile(&self, constraint: &Constraint) -> Result<TokenMask, EngineError> {
        let vocabulary = self.grammar.get_or_init(|| model::grammar_vocabulary(&self.model));
        let vocabulary = vocabulary.as_ref().map_err(|e| EngineError::new(ErrorCode::Unsupported, e.to_string()))?;
        vocabulary
            .compile(constraint)
            .map_err(|e| EngineError::new(ErrorCode::Unsupported, format!("the constraint does not compile: {e}")))
    }
}

/// Settings applied to models loaded from now on (set_config without a model id); `None`
/// means the instance config's value.
#[derive(Clone, Copy)]
struct LoadDefaults {
    kv_type: Option<KvType>,
    threads: Option<u32>,
    swa_full: bool,
    step: StepSettings,
}

pub struct LlamaCppEngine {
    config: EngineConfig,
    defaults: Mutex<LoadDefaults>,
    models: RwLock<HashMap<String, Arc<LoadedModel>>>,
    running: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    /// Last, so that it is dropped after the models: freeing them may still log.
    _log_route: backend::LogRoute,
}

impl LlamaCppEngine {
    fn model(&self, id: &str) -> Result<Arc<LoadedModel>, EngineError> {
        self.models.read().unwrap().get(id).cloned().ok_or_else(|| EngineError::model_not_loaded(id))
    }

    fn threads(&self) -> u32 {
        if self.config.threads > 0 {
            self.config.threads
        } else {
            settings::default_threads()
        }
    }

    fn gpu_layers(&self) -> u32 {
        if self.config.gpu_backend == abi::LLMR_GPU_CPU {
            0
        } else {
            999
        }
    }

    fn embedder(&self, m: &LoadedModel) -> Result<(), EngineError> {
        let mut guard = m.embedder.lock().unwrap();
        if guard.is_some() {
            return Ok(());
        }
        let pooling = if m.meta.is_encoder && m.meta.pooling != LlamaPoolingType::None {
            m.meta.pooling
        } else if m.meta.is_encoder {
            LlamaPoolingType::Cls
        } else {
            LlamaPoolingType::Last
        };
        let n_ctx = m.meta.train_ctx.clamp(64, DEFAULT_CTX_CAP);
        let settings = embed::EmbedSettings { pooling, n_ctx, threads: m.settings.lock().unwrap().threads };
        let model = m.model.clone();
        *guard =
            Some(spawn_worker("llmr-embed".into(), None, move |rx, ready| embed::run(&model, settings, rx, ready))?);
        Ok(())
    }

    /// Runs one generation; `cancel` is the flag `cancel(request_id)` sets.
    fn generate(
        &self,
        m: &LoadedModel,
        req: &InferRequest<'_>,
        sink: &mut TokenSink,
        cancel: Arc<AtomicBool>,
    ) -> Result<InferOutcome, EngineError> {
        let ctx_per_seq = m.settings.lock().unwrap().ctx_per_seq as usize;
        let evicts = m.eviction.lock().unwrap().is_some();
        let tokens = match req.prompt_tokens {
            Some(ids) => checked_token_ids(ids, m.meta.n_vocab.max(0) as usize, "prompt_tokens")?
                .into_iter()
                .map(|id| LlamaToken(id as i32))
                .collect(),
            None => model::tokenize(&m.model, req.prompt, req.add_bos, req.parse_special),
        };
        if tokens.is_empty() {
            return Err(EngineError::new(ErrorCode::Unsupported, "the prompt is empty"));
        }
        if tokens.len() >= ctx_per_seq {
            return Err(EngineError::new(
                ErrorCode::Unsupported,
                format!("the prompt has {} tokens; the context per sequence is {ctx_per_seq}", tokens.len()),
            ));
        }
        let room = (ctx_per_seq - tokens.len()) as u32;
        let mask = req.sampling.constraint.as_ref().map(|c| m.compile(c)).transpose()?;
        let (tx, rx) = mpsc::channel();
        let job = Job {
            request_id: req.request_id,
            // Past the context only when asked for, where middle chunks make room.
            max_tokens: req.sampling.max_tokens.map_or(room, |m| if evicts { m } else { m.min(room) }),
            sampling: req.sampling.clone(),
            mask,
            ignore_eos: req.ignore_eos,
            special_text: req.special_text,
            tokens,
            events: tx,
            cancel: cancel.clone(),
        };
        {
            let scheduler = m.scheduler.lock().unwrap();
            let worker = scheduler.as_ref().ok_or_else(|| EngineError::model_not_loaded(req.model_id))?;
            worker.send(Command::Infer(job))?;
        }
        relay(rx, sink, &cancel)
    }
}

impl Engine for LlamaCppEngine {
    fn info() -> &'static EngineInfo {
        static INFO: EngineInfo = EngineInfo {
            engine_id: c"llama_cpp",
            version: c"0.1.0",
            capabilities: abi::LLMR_CAP_TEXT
                | abi::LLMR_CAP_EMBEDDING
                | abi::LLMR_CAP_CONSTRAINED
                | abi::LLMR_CAP_TOKEN_INPUT
                | abi::LLMR_CAP_SPECIAL_TEXT,
        };
        &INFO
    }

    fn create(config: EngineConfig) -> Result<Self, EngineError> {
        if config.gpu_backend != abi::LLMR_GPU_CPU && !cfg!(any(feature = "cuda", feature = "metal")) {
            return Err(EngineError::new(
                ErrorCode::Unsupported,
                "this build of the llama_cpp plugin was compiled without GPU support (features cuda / metal)",
            ));
        }
        let log_route = backend::route_logs(config.logger);
        backend::backend();
        let chunk = config
            .params
            .get("prefill_chunk")
            .and_then(|v| v.as_u64())
            .map_or(DEFAULT_PREFILL_CHUNK, |v| v.clamp(1, 65536) as u32);
        let stall = match config.params.get("prefill_stall") {
            Some(v) => settings::parse_stall(v)?,
            None => DEFAULT_PREFILL_STALL,
        };
        let prefix_cache_mib = match config.params.get("prefix_cache_mib") {
            Some(v) => settings::parse_prefix_cache_mib(v)?,
            None => DEFAULT_PREFIX_CACHE_MIB,
        };
        let draft_max = match config.params.get("speculative_draft_max") {
            Some(v) => settings::parse_draft_max(v)?,
            None => DraftSettings::DEFAULT.max as u32,
        };
        let draft_threshold = match config.params.get("speculative_threshold") {
            Some(v) => settings::parse_draft_threshold(v)?,
            None => None,
        };
        let swa_full = match config.params.get("swa_full") {
            Some(v) => settings::parse_swa_full(v)?,
            None => false,
        };
        let ctx_checkpoints = match config.params.get("ctx_checkpoints") {
            Some(v) => settings::parse_ctx_checkpoints(v)?,
            None => DEFAULT_CTX_CHECKPOINTS,
        };
        Ok(LlamaCppEngine {
            config,
            defaults: Mutex::new(LoadDefaults {
                kv_type: None,
                threads: None,
                swa_full,
                step: StepSettings {
                    prefill_chunk: chunk,
                    prefill_stall: stall,
                    prefix_cache_mib,
                    draft_max,
                    draft_threshold,
                    ctx_checkpoints,
                    eviction: None,
                    idle_int8: false,
                },
            }),
            models: RwLock::default(),
            running: Mutex::default(),
            _log_route: log_route,
        })
    }

    fn load_model(&self, desc: ModelDesc) -> Result<(), EngineError> {
        if self.models.read().unwrap().contains_key(&desc.model_id) {
            return Err(EngineError::load_failed(format!("model '{}' is already loaded", desc.model_id)));
        }
        let started = Instant::now();
        let kv_cells = desc.options.get("kv_cells").map(settings::parse_kv_cells).transpose()?;
        let model = Arc::new(model::load(&desc.primary_file, self.gpu_layers(), Some(self.config.device_id))?);
        let meta = model::read_meta(&model, &desc.primary_file);
        let defaults = *self.defaults.lock().unwrap();
        let requested_ctx = if desc.context_length > 0 { desc.context_length } else { self.config.context_length };
        let ctx_per_seq = if requested_ctx > 0 { requested_ctx } else { meta.train_ctx.min(DEFAULT_CTX_CAP) };
        // A node-wide KV policy reaches every model: a static level sets the KV type, a dynamic
        // one middle eviction; one that does not parse leaves the defaults and says so.
        let policy = desc.options.get("kv_policy").and_then(|p| match KvType::of_policy(p) {
            Ok(change) => Some(change),
            Err(e) => {
                self.config.logger.warn(&format!("{}: {}", desc.model_id, e.message));
                None
            }
        });
        let shiftable = model::can_shift(&model);
        let mut step = defaults.step;
        if let Some(p) = policy {
            (step.eviction, step.idle_int8) = (p.eviction, p.idle_int8);
        }
        let cache = (shiftable, model::sliding_window(&model), defaults.swa_full);
        step.eviction = runnable_eviction(&desc.model_id, step.eviction, cache, self.config.logger);
        let settings = ContextSettings {
            slots: if self.config.slots > 0 { self.config.slots } else { DEFAULT_SLOTS },
            ctx_per_seq: ctx_per_seq.max(16),
            threads: defaults.threads.unwrap_or_else(|| self.threads()),
            kv_type: policy.and_then(|p| p.kv_type).or(defaults.kv_type).unwrap_or(KvType::F16),
            swa_full: defaults.swa_full,
            kv_cells,
        };
        let stats = Arc::new(Stats::default());
        let scheduler = if meta.is_encoder {
            None
        } else {
            let (m, st, logger) = (model.clone(), stats.clone(), self.config.logger);
            Some(spawn_worker(format!("llmr-sched-{}", desc.model_id), Some(Command::Shutdown), move |rx, ready| {
                scheduler::run(&m, settings, step, rx, st, logger, ready)
            })?)
        };
        self.config.logger.info(&format!(
            "loaded {} ({}, {} params) in {:.0} ms: {} slots x {} tokens, kv {}, {} threads",
            desc.model_id,
            meta.architecture,
            meta.n_params,
            started.elapsed().as_secs_f64() * 1e3,
            settings.slots,
            settings.ctx_per_seq,
            settings.kv_type.name(),
            settings.threads
        ));
        let loaded = Arc::new(LoadedModel {
            model,
            meta,
            quantization: desc.quantization.clone(),
            settings: Mutex::new(settings),
            eviction: Mutex::new(step.eviction),
            shiftable,
            scheduler: Mutex::new(scheduler),
            embedder: Mutex::new(None),
            stats,
            grammar: OnceLock::new(),
        });
        let mut models = self.models.write().unwrap();
        if models.contains_key(&desc.model_id) {
            return Err(EngineError::load_failed(format!("model '{}' is already loaded", desc.model_id)));
        }
        models.insert(desc.model_id, loaded);
        Ok(())
    }

    fn unload_model(&self, model_id: &str) -> Result<(), EngineError> {
        let m = self.models.write().unwrap().remove(model_id).ok_or_else(|| EngineError::model_not_loaded(model_id))?;
        // Cancels what is running and joins the threads; the weights go with the last Arc.
        drop(m.scheduler.lock().unwrap().take());
        drop(m.embedder.lock().unwrap().take());
        Ok(())
    }

    fn model_info(&self, model_id: &str) -> Result<ModelInfo, EngineError> {
        let m = self.model(model_id)?;
        let s = *m.settings.lock().unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("kv_cache_type".into(), s.kv_type.name().into());
        extra.insert("threads".into(), s.threads.into());
        Ok(ModelInfo {
            architecture: Some(m.meta.architecture.clone()),
            context_length: Some(s.ctx_per_seq),
            train_context_length: Some(m.meta.train_ctx),
            vocab_size: Some(m.meta.n_vocab.max(0) as u32),
            embedding_length: Some(m.meta.n_embd.max(0) as u32),
            bos_token: m.meta.bos_token.clone(),
            eos_token: m.meta.eos_token.clone(),
            chat_template: m.meta.chat_template.clone(),
            pooling: Some(model::pooling_name(m.meta.pooling).into()),
            quantization: m.quantization.clone(),
            size_bytes: Some(m.meta.size_bytes),
            parameters: Some(m.meta.n_params),
            slots: Some(s.slots),
            sampling_defaults: m.meta.sampling_defaults,
            capabilities: if m.meta.is_encoder {
                vec![Capability::Embedding]
            } else {
                vec![Capability::Text, Capability::Embedding]
            },
            extra,
            ..ModelInfo::default()
        })
    }

    fn tokenize(
        &self,
        model_id: &str,
        text: &str,
        add_bos: bool,
        parse_special: bool,
    ) -> Result<Vec<i32>, EngineError> {
        let m = self.model(model_id)?;
        Ok(model::tokenize(&m.model, text, add_bos, parse_special).into_iter().map(|t| t.0).collect())
    }

    fn infer(&self, req: &InferRequest<'_>, sink: &mut TokenSink) -> Result<InferOutcome, EngineError> {
        let m = self.model(req.model_id)?;
        if m.meta.is_encoder {
            return Err(EngineError::new(
                ErrorCode::Unsupported,
                format!(
                    "model '{}' ({}) is an embedding model and cannot generate text",
                    req.model_id, m.meta.architecture
                ),
            ));
        }
        let flag = Arc::new(AtomicBool::new(false));
        self.running.lock().unwrap().insert(req.request_id, flag.clone());
        let outcome = self.generate(&m, req, sink, flag);
        self.running.lock().unwrap().remove(&req.request_id);
        outcome
    }

    fn embed(&self, req: &EmbedRequest<'_>, sink: &mut EmbeddingSink) -> Result<EmbedOutcome, EngineError> {
        let m = self.model(req.model_id)?;
        self.embedder(&m)?;
        let inputs: Vec<Vec<LlamaToken>> = match &req.token_inputs {
            Some(lists) => lists
                .iter()
                .enumerate()
                .map(|(i, ids)| {
                    let ids = checked_token_ids(ids, m.meta.n_vocab.max(0) as usize, &format!("token_inputs[{i}]"))?;
                    Ok(ids.into_iter().map(|id| LlamaToken(id as i32)).collect())
                })
                .collect::<Result<_, EngineError>>()?,
            None => req.inputs.iter().map(|t| model::tokenize(&m.model, t, true, false)).collect(),
        };
        if let Some(i) = inputs.iter().position(|t| t.is_empty()) {
            return Err(EngineError::new(ErrorCode::Unsupported, format!("input {i} is empty")));
        }
        let prompt_tokens = inputs.iter().map(|t| t.len() as u32).sum();
        let (tx, rx) = mpsc::channel();
        m.embedder.lock().unwrap().as_ref().expect("started above").send(embed::EmbedJob {
            inputs,
            normalize: req.normalize,
            reply: tx,
        })?;
        let vectors = rx.recv().map_err(|_| EngineError::internal("the embedding worker stopped"))??;
        for (i, v) in vectors.iter().enumerate() {
            if !sink.emit(i, v) {
                return Err(EngineError::cancelled());
            }
        }
        Ok(EmbedOutcome { prompt_tokens })
    }

    fn cancel(&self, request_id: u64) -> Result<(), EngineError> {
        if let Some(flag) = self.running.lock().unwrap().get(&request_id) {
            flag.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    fn metrics(&self) -> Result<serde_json::Value, EngineError> {
        let models = self.models.read().unwrap();
        let per_model: Vec<serde_json::Value> = models
            .iter()
            .map(|(id, m)| {
                let s = &m.stats;
                let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                let settings = *m.settings.lock().unwrap();
                serde_json::json!({
                    "model": id,
                    "slots_total": settings.slots,
                    "slots_busy": get(&s.slots_busy),
                    "queued": get(&s.queued),
                    "requests_total": get(&s.requests_total),
                    "prompt_tokens_total": get(&s.prompt_tokens_total),
                    "cached_tokens_total": get(&s.cached_tokens_total),
                    "tokens_generated_total": get(&s.tokens_generated_total),
                    "decode_steps_total": get(&s.decode_steps_total),
                    "stream_runs_total": get(&s.stream_runs_total),
                    "kv_cells_used": get(&s.kv_cells_used),
                    "kv_cells_total": get(&s.kv_cells_total),
                    // KV positions per level of the staged cache (spec 002): one type for all the
                    // positions held, and L3 those running sequences evicted (middle chunks).
                    "kv_levels": {
                        "L0": if settings.kv_type.level() == Level::F16 { get(&s.kv_cells_used) } else { 0 },
                        "L1": if settings.kv_type.level() == Level::Int8 { get(&s.kv_cells_used) } else { 0 },
                        "L2": if settings.kv_type.level() == Level::Int4 { get(&s.kv_cells_used) } else { 0 },
                        "L3": get(&s.kv_evicted),
                    },
                    "kv_eviction": m.eviction.lock().unwrap().map(|e| serde_json::json!({"sink_tokens": e.sinks, "recent_window": e.window})),
                    "kv_shifts_total": get(&s.kv_shifts_total),
                    "kv_evicted_total": get(&s.kv_evicted_total),
                    // Sequences set aside when the cells ran out, to resume later.
                    "preemptions_total": get(&s.preemptions_total),
                    "prefix_cache_bytes": get(&s.prefix_cache_bytes),
                    "prefix_cache_entries": get(&s.prefix_cache_entries),
                    "prefix_cache_saved_total": get(&s.prefix_cache_saved_total),
                    "prefix_cache_restored_total": get(&s.prefix_cache_restored_total),
                    // Of those saved, how many at int8 (a dynamic KV policy).
                    "prefix_cache_int8_total": get(&s.prefix_cache_int8_total),
                    "prefix_copies_total": get(&s.prefix_copies_total),
                    // Speculative decoding: draft tokens fed and how many the sampler kept.
                    "draft_tokens_total": get(&s.draft_tokens_total),
                    "draft_accepted_total": get(&s.draft_accepted_total),
                    "kv_separate_streams": scheduler::separate_streams(&settings),
                    "kv_cache_type": settings.kv_type.name(),
                    // The KV cache llama.cpp allocated for the context (both caches of a
                    // sliding-window model), as llama.cpp reported it.
                    "kv_bytes": get(&s.kv_bytes),
                    "kv_swa_full": settings.swa_full,
                    // Sliding-window caches (window-sized): checkpoints taken and resumed from,
                    // and prompts read again from the start for want of the window.
                    "ctx_checkpoints_saved_total": get(&s.ctx_checkpoints_saved_total),
                    "ctx_checkpoints_restored_total": get(&s.ctx_checkpoints_restored_total),
                    "ctx_checkpoint_bytes": get(&s.ctx_checkpoint_bytes),
                    "window_reprocessed_total": get(&s.window_reprocessed_total),
                    "constrained_tokens_total": get(&s.constrained_tokens_total),
                    "constraint_seconds_total": get(&s.constraint_ns_total) as f64 / 1e9,
                })
            })
            .collect();
        let sum = |key: &str| per_model.iter().filter_map(|m| m[key].as_u64()).sum::<u64>();
        Ok(serde_json::json!({
            "slots_total": sum("slots_total"),
            "slots_busy": sum("slots_busy"),
            "requests_total": sum("requests_total"),
            "tokens_generated_total": sum("tokens_generated_total"),
            "kv_cells_used": sum("kv_cells_used"),
            "kv_cells_total": sum("kv_cells_total"),
            "kv_bytes": sum("kv_bytes"),
            "prefix_cache_bytes": sum("prefix_cache_bytes"),
            "models": per_model,
        }))
    }

    fn set_config(&self, model_id: Option<&str>, key: &str, value: serde_json::Value) -> Result<(), EngineError> {
        let change = settings::parse_change(key, &value)?;
        let targets: Vec<(String, Arc<LoadedModel>)> = match model_id {
            Some(id) => vec![(id.to_string(), self.model(id)?)],
            None => {
                let mut d = self.defaults.lock().unwrap();
                match change {
                    Change::KvType(t) => d.kv_type = Some(t),
                    Change::Policy(p) => {
                        d.kv_type = p.kv_type.or(d.kv_type);
                        (d.step.eviction, d.step.idle_int8) = (p.eviction, p.idle_int8);
                    }
                    Change::Threads(n) => d.threads = Some(n),
                    Change::PrefillChunk(n) => d.step.prefill_chunk = n,
                    Change::PrefillStall(s) => d.step.prefill_stall = s,
                    Change::PrefixCacheMib(n) => d.step.prefix_cache_mib = n,
                    Change::DraftMax(n) => d.step.draft_max = n,
                    Change::DraftThreshold(t) => d.step.draft_threshold = t,
                    Change::SwaFull(b) => d.swa_full = b,
                    Change::CtxCheckpoints(n) => d.step.ctx_checkpoints = n,
                }
                self.models.read().unwrap().iter().map(|(id, m)| (id.clone(), m.clone())).collect()
            }
        };
        for (id, m) in targets {
            let change = match change {
                Change::Policy(p) => Change::Policy(m.doable(&id, p, self.config.logger)),
                other => other,
            };
            {
                let mut s = m.settings.lock().unwrap();
                match change {
                    Change::KvType(t) => s.kv_type = t,
                    Change::Policy(p) => {
                        s.kv_type = p.kv_type.unwrap_or(s.kv_type);
                        *m.eviction.lock().unwrap() = p.eviction;
                    }
                    Change::Threads(n) => s.threads = n,
                    Change::SwaFull(b) => s.swa_full = b,
                    Change::PrefillChunk(_)
                    | Change::PrefillStall(_)
                    | Change::PrefixCacheMib(_)
                    | Change::DraftMax(_)
                    | Change::DraftThreshold(_)
                    | Change::CtxCheckpoints(_) => {}
                }
            }
            if let Some(w) = m.scheduler.lock().unwrap().as_ref() {
                w.send(Command::Change(change))?;
            }
        }
        Ok(())
    }
}

export_engine!(LlamaCppEngine);
