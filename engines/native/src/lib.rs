//! llmr's Rust-native engine plugin: Hugging Face safetensors checkpoints run directly, the
//! architecture chosen from the model's own `config.json`, its own `tokenizer.json` and chat
//! template. CPU kernels in f32 over weights kept as stored (bf16 / f16 / f32, memory-mapped);
//! continuous batching over a block KV cache (`kv_cache.rs`) that shares full blocks between
//! requests with equal prefixes.

pub mod arch;
pub mod attention;
pub mod checkpoint;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
mod embed;
mod generation_config;
pub mod kernels;
pub mod kv_arena;
pub mod kv_cache;
pub mod kv_control;
pub mod kv_eval;
pub mod kv_levels;
pub mod kv_recall;
pub mod kv_retrieval;
pub mod kv_spill;
pub mod rope;
mod scheduler;
mod settings;
pub mod tokenizer;

use arch::Model;
use checkpoint::{Checkpoint, CheckpointError};
use config::{ConfigError, ModelConfig};
use embed::{EmbedJob, Pooling};
use kv_cache::{KvPool, Shape, BLOCK_TOKENS};
use kv_recall::RECALL_SHARE;
use llmr_constraint::{TokenMask, Vocabulary, VocabularyError};
use llmr_engine_sdk::worker::{relay, spawn_worker, Worker};
use llmr_engine_sdk::{
    abi, checked_token_ids, Capability, Constraint, EmbedOutcome, EmbedRequest, EmbeddingSink, Engine, EngineConfig,
    EngineError, EngineInfo, ErrorCode, Format, InferOutcome, InferRequest, ModelDesc, ModelInfo, SamplingDefaults,
    TokenSink,
};
use llmr_kv_policy::{Calibration, KvPolicy};
use scheduler::{Command, Job, Scheduler, Stats, StepSettings};
use settings::{LiveChange, LiveSettings};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;
use tokenizer::ModelTokenizer;

const DEFAULT_SLOTS: u32 = 4;
/// The default context per sequence is the model's training context, capped (as the llama.cpp
/// plugin caps it): KV blocks are allocated as used, but the pool's bound follows from it.
const DEFAULT_CTX_CAP: u32 = 8192;

struct LoadedModel {
    config: ModelConfig,
    tokenizer: Arc<ModelTokenizer>,
    ctx_per_seq: u32,
    slots: u32,
    threads: usize,
    kv_blocks: usize,
    weight_bytes: usize,
    pooling: Pooling,
    /// The KV policy its scheduler runs (patches apply on top of it).
    policy: Mutex<KvPolicy>,
    /// What each KV level costs this model in quality, where the evaluator measured it
    /// (`delta_ppl_est` in the metrics).
    calibration: Option<Calibration>,
    /// `tokenizer.json`, read again when the first constrained request comes.
    tokenizer_file: PathBuf,
    /// What `generation_config.json` recommends for sampling.
    sampling_defaults: Option<SamplingDefaults>,
    /// The vocabulary compiled for constrained decoding, on first use (it takes a moment that
    /// models never asked for structured output should not pay at load).
    grammar: OnceLock<Result<Arc<Vocabulary>, VocabularyError>>,
    scheduler: Worker<Command>,
    stats: Arc<Stats>,
}

pub struct NativeEngine {
    config: EngineConfig,
    /// Step settings for models loaded from now on (`set_config` without a model id changes them
    /// and every loaded model's).
    step: Mutex<LiveSettings>,
    /// The KV policy of models loaded from now on (`kv_policy` param, `set_config` without a
    /// model id).
    policy: Mutex<KvPolicy>,
    models: RwLock<HashMap<String, Arc<LoadedModel>>>,
    running: Mutex<HashMap<u64, Arc<AtomicBool>>>,
}

impl LoadedModel {
    /// A request's constraint compiled against the model's vocabulary (built on first use). Either
    /// failing is UNSUPPORTED with the reason: the node answers 400 on the constraint's field.
    fn compile(&self, constraint: &Constraint) -> Result<TokenMask, EngineError> {
        let vocabulary = self.grammar.get_or_init(|| {
            let json = std::fs::read_to_string(&self.tokenizer_file)
                .map_err(|e| VocabularyError(format!("{}: {e}", self.tokenizer_file.display())))?;
            // Sorted for a stable order; the grammar engine ends on any of them alike.
            let mut ends: Vec<u32> = self.tokenizer.end_ids.iter().copied().collect();
            ends.sort_unstable();
            Vocabulary::from_tokenizer_json(&json, self.config.vocab, &ends).map(Arc::new)
        });
        let vocabulary = vocabulary.as_ref().map_err(|e| EngineError::new(ErrorCode::Unsupported, e.to_string()))?;
        vocabulary
            .compile(constraint)
            .map_err(|e| EngineError::new(ErrorCode::Unsupported, format!("the constraint does not compile: {e}")))
    }
}

fn corrupt(e: CheckpointError) -> EngineError {
    match e {
        CheckpointError::Io { .. } => EngineError::load_failed(e.to_string()),
        _ => EngineError::new(ErrorCode::ModelCorrupt, e.to_string()),
    }
}

/// Hands the heap's free pages back to the OS. Reading tokenizer.json parses it into
/// temporaries (about 100 MB for Gemma 3's 262,144 tokens and their merges) that glibc keeps
/// mapped once freed: they lie below live allocations, where its own trimming at the top of the
/// heap never reaches, and would stay in the process's RSS for its whole life.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only returns free pages of glibc's heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl NativeEngine {
    fn model(&self, id: &str) -> Result<Arc<LoadedModel>, EngineError> {
        self.models.read().unwrap().get(id).cloned().ok_or_else(|| EngineError::model_not_loaded(id))
    }

    fn generate(
        &self,
        m: &LoadedModel,
        req: &InferRequest<'_>,
        sink: &mut TokenSink,
        cancel: Arc<AtomicBool>,
    ) -> Result<InferOutcome, EngineError> {
        let tokens = match req.prompt_tokens {
            Some(ids) => checked_token_ids(ids, m.config.vocab, "prompt_tokens")?,
            None => m
                .tokenizer
                .encode(req.prompt, req.add_bos, req.parse_special)
                .map_err(|e| EngineError::new(ErrorCode::Unsupported, format!("cannot tokenize the prompt: {e}")))?,
        };
        let ctx = m.ctx_per_seq as usize;
        if tokens.is_empty() {
            return Err(EngineError::new(ErrorCode::Unsupported, "the prompt is empty"));
        }
        if tokens.len() >= ctx {
            return Err(EngineError::new(
                ErrorCode::Unsupported,
                format!("the prompt has {} tokens; the context per sequence is {ctx}", tokens.len()),
            ));
        }
        let room = (ctx - tokens.len()) as u32;
        let mask = req.sampling.constraint.as_ref().map(|c| m.compile(c)).transpose()?;
        let (tx, rx) = mpsc::channel();
        m.scheduler.send(Command::Infer(Job {
            request_id: req.request_id,
            max_tokens: req.sampling.max_tokens.map_or(room, |n| n.min(room)),
            sampling: req.sampling.clone(),
            mask,
            ignore_eos: req.ignore_eos,
            special_text: req.special_text,
            tokens,
            events: tx,
            cancel: cancel.clone(),
        }))?;
        relay(rx, sink, &cancel)
    }

    fn on_gpu(&self) -> bool {
        cfg!(feature = "cuda") && self.config.gpu_backend == abi::LLMR_GPU_CUDA
    }

    /// A setting from the model's load options, else the engine's params.
    fn setting<'a>(&'a self, desc: &'a ModelDesc, key: &str) -> Option<&'a serde_json::Value> {
        desc.options.get(key).or_else(|| self.config.params.get(key))
    }

    /// A true/false setting (`default` when unset); anything else fails the load, naming it.
    fn flag(&self, desc: &ModelDesc, key: &str, default: bool) -> Result<bool, EngineError> {
        match self.setting(desc, key) {
            None => Ok(default),
            Some(v) => {
                v.as_bool().ok_or_else(|| EngineError::load_failed(format!("`{key}` takes true or false, got {v}")))
            }
        }
    }

    /// The model's KV calibration table (`kv-eval --calibrate` writes it into the model's
    /// folder). A table that cannot be read is logged and left out: it only feeds an estimate.
    /// One measured with recall on and served with it off, or the other way, is kept, with a
    /// warning: its eviction cost is the other setting's.
    fn calibration(&self, dir: &std::path::Path, pool: &KvPool) -> Option<Calibration> {
        let table = Calibration::read(dir).unwrap_or_else(|e| {
            self.config.logger.warn(&format!("KV calibration table ignored: {e}"));
            None
        })?;
        let (measured, serving) = (table.recall.is_some(), pool.recall_share().is_some());
        if measured != serving {
            let with = |on: bool| if on { "with" } else { "without" };
            self.config.logger.warn(&format!(
                "KV calibration table measured {} recall, served {} it: delta_ppl_est prices eviction as {}",
                with(measured),
                with(serving),
                if measured { "cheaper than it is" } else { "dearer than it is" },
            ));
        }
        Some(table)
    }

    /// Keeps the f16 copies of blocks stored lower in a spill file (`kv_spill.rs`), so that
    /// promotion is exact, unless `kv_promotion` (a load option or engine param) is false: then
    /// levels only go down. With the copies, evicted blocks keep an int4 index of their keys and
    /// attention reads them back when a query needs them (`kv_recall.rs`), unless `kv_recall`
    /// is false. A spill file that cannot be created is logged, and levels only go down.
    fn enable_promotion(&self, desc: &ModelDesc, pool: &mut KvPool) -> Result<(), EngineError> {
        if self.flag(desc, "kv_promotion", true)? {
            if let Err(e) = pool.enable_spill() {
                self.config
                    .logger
                    .warn(&format!("KV spill file not created ({e}): blocks are not promoted back to f16"));
            }
            if self.flag(desc, "kv_recall", true)? {
                pool.enable_recall(RECALL_SHARE);
            }
        }
        Ok(())
    }

    /// The sliding-window layers whose blocks out of every window still to come give their
    /// storage back (`KvPool::with_window`), unless `swa_full` (a load option or engine param,
    /// as llama.cpp's) keeps every position.
    fn window_layers(&self, desc: &ModelDesc, config: &ModelConfig) -> Result<Vec<usize>, EngineError> {
        if self.flag(desc, "swa_full", false)? {
            return Ok(Vec::new());
        }
        Ok((0..config.layers).filter(|&l| config.layer_attention[l] == config::LayerAttention::Sliding).collect())
    }

    /// The KV budget in bytes: `kv_budget_mib` from the model's load options or the engine's
    /// params, else what `slots` sequences of `ctx` positions hold at most in f16
    /// (`context_bytes`). It must hold one such sequence, so that one sequence can always run.
    fn kv_budget(&self, desc: &ModelDesc, slots: usize, one_context: usize) -> Result<usize, EngineError> {
        let key = "kv_budget_mib";
        let Some(value) = self.setting(desc, key) else {
            return Ok(slots * one_context);
        };
        match value.as_f64() {
            Some(mib) if mib.is_finite() && mib * 1048576.0 >= one_context as f64 => Ok((mib * 1048576.0) as usize),
            _ => Err(EngineError::load_failed(format!(
                "`{key}` must be a number of MiB holding at least one full context in f16 ({:.1} MiB), got {value}",
                one_context as f64 / 1048576.0
            ))),
        }
    }

    /// The model's weights where the instance runs (CPU, or the configured GPU), with a pool of
    /// `blocks` KV blocks whose storage lives beside them.
    fn place(
        &self,
        config: &ModelConfig,
        checkpoint: &Checkpoint,
        shape: Shape,
        blocks: usize,
    ) -> Result<(Model, KvPool), EngineError> {
        #[cfg(feature = "cuda")]
        if self.config.gpu_backend == abi::LLMR_GPU_CUDA {
            use cuda::{GpuError, LoadError};
            let device = self.config.device_id.max(0) as usize;
            let model = cuda::CudaModel::load(config, checkpoint, device, (shape, blocks), Some(self.config.logger))
                .map_err(|e| match e {
                    LoadError::Checkpoint(e) => corrupt(e),
                    LoadError::Gpu(GpuError::OutOfMemory(m)) => EngineError::new(ErrorCode::OomVram, m),
                    LoadError::Gpu(e) => EngineError::load_failed(e.to_string()),
                    LoadError::Unsupported(m) => EngineError::new(ErrorCode::Unsupported, m),
                })?;
            self.config.logger.info(&format!("weights and KV cache on {}", model.device_name()));
            return Ok((Model::Cuda(Box::new(model)), KvPool::without_storage(shape, blocks)));
        }
        Ok((Model::load(config, checkpoint).map_err(corrupt)?, KvPool::new(shape, blocks)))
    }
}

impl Engine for NativeEngine {
    fn info() -> &'static EngineInfo {
        static INFO: EngineInfo = EngineInfo {
            engine_id: c"native",
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
        let cuda = cfg!(feature = "cuda") && config.gpu_backend == abi::LLMR_GPU_CUDA;
        if config.gpu_backend != abi::LLMR_GPU_CPU && !cuda {
            return Err(EngineError::new(
                ErrorCode::Unsupported,
                "this build of the native engine runs on the CPU, and on CUDA GPUs when built with the `cuda` feature",
            ));
        }
        let step = LiveSettings::default().with_keys_of(&config.params)?;
        let policy = match config.params.get("kv_policy") {
            Some(patch) => policy_for(&KvPolicy::baseline(), patch, cuda)?,
            None => KvPolicy::baseline(),
        };
        Ok(NativeEngine {
            config,
            step: Mutex::new(step),
            policy: Mutex::new(policy),
            models: RwLock::default(),
            running: Mutex::default(),
        })
    }

    fn load_model(&self, desc: ModelDesc) -> Result<(), EngineError> {
        if desc.format != Format::Safetensors {
            return Err(EngineError::new(
                ErrorCode::Unsupported,
                format!("the native engine reads safetensors models, not {}", desc.format.as_str()),
            ));
        }
        if self.models.read().unwrap().contains_key(&desc.model_id) {
            return Err(EngineError::load_failed(format!("model '{}' is already loaded", desc.model_id)));
        }
        let started = Instant::now();
        let mut config = ModelConfig::read(&desc.model_dir.join("config.json")).map_err(|e| match e {
            ConfigError::Unsupported(_) | ConfigError::UnsupportedVariant(_) => {
                EngineError::new(ErrorCode::Unsupported, e.to_string())
            }
            _ => EngineError::load_failed(e.to_string()),
        })?;
        // bf16 weights multiply inputs rounded to bf16 where the CPU has AVX-512 BF16, as
        // llama.cpp does (about twice the f32 kernels' speed); `bf16_products: false` keeps f32.
        config.bf16_products = self.flag(&desc, "bf16_products", true)?;
        // From 64 input rows on (prefill chunks), those products run on AMX tiles where the CPU
        // has them; `amx_products: false` keeps the dot kernels at every batch size.
        config.amx_products = self.flag(&desc, "amx_products", true)?;
        let checkpoint = Checkpoint::open(&desc.primary_file).map_err(corrupt)?;
        let tokenizer = Arc::new(
            ModelTokenizer::load(&desc.model_dir, config.vocab, &config.eos, config.bos)
                .map_err(|e| EngineError::load_failed(e.to_string()))?,
        );
        let requested = if desc.context_length > 0 { desc.context_length } else { self.config.context_length };
        let ctx_per_seq =
            if requested > 0 { requested } else { (config.context_length as u32).min(DEFAULT_CTX_CAP) }.max(16);
        let slots = if self.config.slots > 0 { self.config.slots } else { DEFAULT_SLOTS };
        let threads = if self.config.threads > 0 { self.config.threads as usize } else { default_threads() };
        let shape = Shape { layers: config.layers, kv_heads: config.kv_heads, head_dim: config.head_dim };
        // The model's load options override the engine's step settings for it.
        let live =
            self.step.lock().unwrap().with_keys_of(&desc.options).map_err(|e| EngineError::load_failed(e.message))?;
        // Every slot can hold a full context; blocks are allocated as they are first used. A
        // byte budget (`kv_budget_mib`) may be smaller: a KV policy then fits more in it.
        let kv_blocks = slots as usize * (ctx_per_seq as usize).div_ceil(BLOCK_TOKENS);
        let sliding = self.window_layers(&desc, &config)?;
        // A GPU's buffer keeps every position of every layer (its pool has no storage to drop).
        let dropping = if self.on_gpu() { 0 } else { sliding.len() };
        let one_context =
            shape.context_bytes(ctx_per_seq as usize, dropping, config.sliding_window, live.prefill_chunk);
        let budget = self.kv_budget(&desc, slots as usize, one_context)?;
        let (model, pool) = self.place(&config, &checkpoint, shape, kv_blocks)?;
        let mut pool = pool.with_budget(budget).with_window(sliding, config.sliding_window);
        self.enable_promotion(&desc, &mut pool)?;
        let calibration = self.calibration(&desc.model_dir, &pool);
        let mut policy = match desc.options.get("kv_policy") {
            Some(patch) => policy_for(&self.policy.lock().unwrap(), patch, false)?,
            None => *self.policy.lock().unwrap(),
        };
        if self.on_gpu() && policy.is_active() {
            // A node-wide policy reaches every model; on the GPU the cache stays f16.
            self.config.logger.warn("the CUDA backend keeps its KV cache in f16: KV policy not applied");
            policy = KvPolicy::baseline();
        }
        let model = Arc::new(model);
        let pool_threads = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("llmr-native-{i}"))
                .build()
                .map_err(|e| EngineError::new(ErrorCode::OomRam, format!("cannot start the thread pool: {e}")))?,
        );
        let stats = Arc::new(Stats::default());
        let settings = StepSettings { slots: slots as usize, ctx_per_seq: ctx_per_seq as usize, live };
        let (st, logger, tk, vocab) = (stats.clone(), self.config.logger, tokenizer.clone(), config.vocab);
        let scheduler =
            spawn_worker(format!("llmr-sched-{}", desc.model_id), Some(Command::Shutdown), move |rx, ready| {
                let s = Scheduler::new(model, tk, vocab, pool, pool_threads, settings, policy, st, logger);
                let _ = ready.send(Ok(()));
                s.run(rx)
            })?;
        self.config.logger.info(&format!(
            "loaded {} ({}, {} layers) in {:.0} ms: {slots} slots x {ctx_per_seq} tokens, {threads} threads",
            desc.model_id,
            config.model_type,
            config.layers,
            started.elapsed().as_secs_f64() * 1e3,
        ));
        let loaded = Arc::new(LoadedModel {
            weight_bytes: checkpoint.mapped_bytes(),
            pooling: Pooling::of_model(&desc.model_dir),
            config,
            tokenizer,
            ctx_per_seq,
            slots,
            threads,
            kv_blocks,
            policy: Mutex::new(policy),
            calibration,
            tokenizer_file: desc.model_dir.join("tokenizer.json"),
            sampling_defaults: generation_config::sampling_defaults(&desc.model_dir),
            grammar: OnceLock::new(),
            scheduler,
            stats,
        });
        let mut models = self.models.write().unwrap();
        if models.contains_key(&desc.model_id) {
            return Err(EngineError::load_failed(format!("model '{}' is already loaded", desc.model_id)));
        }
        models.insert(desc.model_id, loaded);
        drop(models);
        release_freed_heap();
        Ok(())
    }

    fn unload_model(&self, model_id: &str) -> Result<(), EngineError> {
        let m = self.models.write().unwrap().remove(model_id).ok_or_else(|| EngineError::model_not_loaded(model_id))?;
        // The worker stops (cancelling what runs) once the last request holding the model is done.
        drop(m);
        Ok(())
    }

    fn model_info(&self, model_id: &str) -> Result<ModelInfo, EngineError> {
        let m = self.model(model_id)?;
        let c = &m.config;
        let mut extra = serde_json::Map::new();
        extra.insert("threads".into(), m.threads.into());
        extra.insert("kv_cache_type".into(), "f16".into());
        extra.insert("kv_block_tokens".into(), BLOCK_TOKENS.into());
        extra.insert("kv_blocks".into(), m.kv_blocks.into());
        extra.insert("kv_budget_bytes".into(), m.stats.kv_budget_bytes.load(Ordering::Relaxed).into());
        extra.insert("kv_policy".into(), serde_json::to_value(*m.policy.lock().unwrap()).unwrap_or_default());
        Ok(ModelInfo {
            architecture: Some(c.model_type.clone()),
            context_length: Some(m.ctx_per_seq),
            train_context_length: Some(c.context_length as u32),
            vocab_size: Some(c.vocab as u32),
            embedding_length: Some(c.hidden as u32),
            bos_token: m.tokenizer.bos_token.clone(),
            eos_token: m.tokenizer.eos_token.clone(),
            chat_template: m.tokenizer.chat_template.clone(),
            pooling: Some(m.pooling.name().into()),
            quantization: None,
            size_bytes: Some(m.weight_bytes as u64),
            parameters: None,
            slots: Some(m.slots),
            sampling_defaults: m.sampling_defaults,
            capabilities: vec![Capability::Text, Capability::Embedding],
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
        let ids = m
            .tokenizer
            .encode(text, add_bos, parse_special)
            .map_err(|e| EngineError::new(ErrorCode::Unsupported, format!("cannot tokenize: {e}")))?;
        Ok(ids.into_iter().map(|i| i as i32).collect())
    }

    fn infer(&self, req: &InferRequest<'_>, sink: &mut TokenSink) -> Result<InferOutcome, EngineError> {
        let m = self.model(req.model_id)?;
        let flag = Arc::new(AtomicBool::new(false));
        self.running.lock().unwrap().insert(req.request_id, flag.clone());
        let outcome = self.generate(&m, req, sink, flag);
        self.running.lock().unwrap().remove(&req.request_id);
        outcome
    }

    fn embed(&self, req: &EmbedRequest<'_>, sink: &mut EmbeddingSink) -> Result<EmbedOutcome, EngineError> {
        let m = self.model(req.model_id)?;
        let ctx = m.ctx_per_seq as usize;
        let count = req.token_inputs.as_ref().map_or(req.inputs.len(), Vec::len);
        let mut inputs = Vec::with_capacity(count);
        for i in 0..count {
            let tokens = match &req.token_inputs {
                Some(lists) => checked_token_ids(lists[i], m.config.vocab, &format!("token_inputs[{i}]"))?,
                None => m
                    .tokenizer
                    .encode_with_special(req.inputs[i])
                    .map_err(|e| EngineError::new(ErrorCode::Unsupported, format!("cannot tokenize input {i}: {e}")))?,
            };
            if tokens.is_empty() {
                return Err(EngineError::new(ErrorCode::Unsupported, format!("input {i} is empty")));
            }
            if tokens.len() > ctx {
                return Err(EngineError::new(
                    ErrorCode::Unsupported,
                    format!("input {i} has {} tokens; this model embeds at most {ctx}", tokens.len()),
                ));
            }
            inputs.push(tokens);
        }
        let prompt_tokens = inputs.iter().map(|t| t.len() as u32).sum();
        let (tx, rx) = mpsc::channel();
        m.scheduler.send(Command::Embed(EmbedJob {
            inputs,
            normalize: req.normalize,
            pooling: m.pooling,
            reply: tx,
        }))?;
        let vectors = rx.recv().map_err(|_| EngineError::internal("the model's worker stopped"))??;
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

    fn set_config(&self, model_id: Option<&str>, key: &str, value: serde_json::Value) -> Result<(), EngineError> {
        if key == "kv_policy" {
            // Checked here, so that a refused patch leaves the running policy as it was.
            return match model_id {
                Some(id) => {
                    let m = self.model(id)?;
                    let mut current = m.policy.lock().unwrap();
                    let policy = policy_for(&current, &value, self.on_gpu())?;
                    m.scheduler.send(Command::Policy(policy))?;
                    *current = policy;
                    Ok(())
                }
                None => {
                    let mut default = self.policy.lock().unwrap();
                    let policy = policy_for(&default, &value, self.on_gpu())?;
                    *default = policy;
                    for m in self.models.read().unwrap().values() {
                        m.scheduler.send(Command::Policy(policy))?;
                        *m.policy.lock().unwrap() = policy;
                    }
                    Ok(())
                }
            };
        }
        let change = LiveChange::parse(key, &value)?;
        match model_id {
            Some(id) => self.model(id)?.scheduler.send(Command::Step(change)),
            None => {
                self.step.lock().unwrap().apply(change);
                for m in self.models.read().unwrap().values() {
                    m.scheduler.send(Command::Step(change))?;
                }
                Ok(())
            }
        }
    }

    fn metrics(&self) -> Result<serde_json::Value, EngineError> {
        let models = self.models.read().unwrap();
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let per_model: Vec<serde_json::Value> = models
            .iter()
            .map(|(id, m)| {
                let s = &m.stats;
                // KV positions in use per level (a policy moves every layer of a block together).
                let positions = |l: usize| get(&s.kv_levels[l]) * BLOCK_TOKENS as u64 / m.config.layers.max(1) as u64;
                serde_json::json!({
                    "model": id,
                    "slots_total": m.slots,
                    "slots_busy": get(&s.running),
                    "decoding": get(&s.decoding),
                    "queued": get(&s.queued),
                    "requests_total": get(&s.requests_total),
                    "prompt_tokens_total": get(&s.prompt_tokens_total),
                    "cached_tokens_total": get(&s.cached_tokens_total),
                    "tokens_generated_total": get(&s.tokens_generated_total),
                    "decode_steps_total": get(&s.decode_steps_total),
                    "kv_blocks_used": get(&s.kv_blocks_used),
                    "kv_blocks_total": get(&s.kv_blocks_total),
                    "kv_bytes": get(&s.kv_bytes),
                    "kv_budget_bytes": get(&s.kv_budget_bytes),
                    "kv_levels": { "L0": positions(0), "L1": positions(1), "L2": positions(2), "L3": positions(3) },
                    "kv_policy": *m.policy.lock().unwrap(),
                    // Relative delta-PPL (percent) of the cache as it is now, from the model's
                    // calibration table; null where it has none.
                    "delta_ppl_est": m.calibration.as_ref().map(|c| c.estimate([0, 1, 2, 3].map(positions))),
                    "policy_passes_total": get(&s.policy_passes_total),
                    "policy_seconds_total": get(&s.policy_ns_total) as f64 / 1e9,
                    "policy_blocks_changed_total": get(&s.policy_blocks_changed_total),
                    "policy_blocks_promoted_total": get(&s.policy_blocks_promoted_total),
                    "kv_recalls_total": get(&s.kv_recalls_total),
                    "policy_errors_total": get(&s.policy_errors_total),
                    "preemptions_total": get(&s.preemptions_total),
                    "constrained_tokens_total": get(&s.constrained_tokens_total),
                    "constraint_seconds_total": get(&s.constraint_ns_total) as f64 / 1e9,
                    "draft_tokens_total": get(&s.draft_tokens_total),
                    "draft_accepted_total": get(&s.draft_accepted_total),
                })
            })
            .collect();
        Ok(serde_json::json!({ "models": per_model }))
    }
}

/// `patch` (a `kv_policy` object) applied to `current`, or the error naming the field.
fn policy_for(current: &KvPolicy, patch: &serde_json::Value, on_gpu: bool) -> Result<KvPolicy, EngineError> {
    let policy = current.patched_json(patch).map_err(|e| EngineError::new(ErrorCode::Unsupported, e.to_string()))?;
    if on_gpu && policy.is_active() {
        return Err(EngineError::new(
            ErrorCode::Unsupported,
            "kv policy: the CUDA backend keeps its KV cache in f16; levels run on the CPU build",
        ));
    }
    Ok(policy)
}

llmr_engine_sdk::export_engine!(NativeEngine);
