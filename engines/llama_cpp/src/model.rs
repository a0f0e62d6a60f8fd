//! Loading a GGUF file and reading what the host needs from its header.

use crate::backend;
use llama_cpp_2::context::params::LlamaPoolingType;
use llama_cpp_2::model::params::{LlamaModelParams, LlamaSplitMode};
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llmr_constraint::{TokenBytes, Vocabulary, VocabularyError};
use llmr_engine_sdk::{EngineError, ErrorCode, SamplingDefaults};
use std::io::Read;
use std::path::Path;

/// Facts about a loaded model, read once from its GGUF header.
#[derive(Clone, Debug)]
pub struct ModelMeta {
    pub architecture: String,
    pub train_ctx: u32,
    pub n_vocab: i32,
    pub n_embd: i32,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pooling: LlamaPoolingType,
    /// Encoder-only (BERT-like): used for embeddings, never for generation.
    pub is_encoder: bool,
    pub size_bytes: u64,
    pub n_params: u64,
    /// `general.sampling.*`: what the model recommends for what requests leave unset.
    pub sampling_defaults: Option<SamplingDefaults>,
}

fn corrupt(path: &Path, why: String) -> EngineError {
    EngineError::new(ErrorCode::ModelCorrupt, format!("{} is a damaged GGUF file: {why}", path.display()))
}

/// Refuses what is not a GGUF file before llama.cpp sees it, so that "wrong file" (LOAD_FAILED)
/// and "damaged file" (MODEL_CORRUPT) are told apart.
fn check_gguf(path: &Path) -> Result<(), EngineError> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| EngineError::load_failed(format!("cannot open model file {}: {e}", path.display())))?;
    let mut magic = [0u8; 4];
    match file.read_exact(&mut magic) {
        Ok(()) if &magic == b"GGUF" => Ok(()),
        Ok(()) => {
            Err(EngineError::load_failed(format!("{} is not a GGUF file (magic {:02x?})", path.display(), magic)))
        }
        Err(_) => {
            Err(EngineError::load_failed(format!("{} is not a GGUF file (shorter than 4 bytes)", path.display())))
        }
    }
}

/// Loads the model with `gpu_layers` offloaded; `device` (the host's placement, spec 003) keeps
/// the whole model on that one GPU instead of llama.cpp's default split over every GPU.
pub fn load(path: &Path, gpu_layers: u32, device: Option<i32>) -> Result<LlamaModel, EngineError> {
    check_gguf(path)?;
    let mut params = LlamaModelParams::default().with_n_gpu_layers(gpu_layers);
    if let Some(device) = device.filter(|&d| d >= 0 && gpu_layers > 0) {
        params = params.with_main_gpu(device).with_split_mode(LlamaSplitMode::None);
    }
    backend::clear_last_error();
    LlamaModel::load_from_file(backend::backend(), path, &params).map_err(|e| {
        let why = backend::last_error();
        corrupt(path, if why.is_empty() { e.to_string() } else { why })
    })
}

fn meta(model: &LlamaModel, key: &str) -> Option<String> {
    model.meta_val_str(key).ok().filter(|s| !s.is_empty())
}

fn token_text(model: &LlamaModel, token: LlamaToken) -> Option<String> {
    (token.0 >= 0).then(|| String::from_utf8_lossy(&model.vocab().token_to_piece(token, true, None)).into_owned())
}

pub fn read_meta(model: &LlamaModel, path: &Path) -> ModelMeta {
    let architecture = meta(model, "general.architecture").unwrap_or_else(|| "unknown".into());
    let pooling = match meta(model, &format!("{architecture}.pooling_type")).and_then(|v| v.parse::<i32>().ok()) {
        Some(1) => LlamaPoolingType::Mean,
        Some(2) => LlamaPoolingType::Cls,
        Some(3) => LlamaPoolingType::Last,
        Some(4) => LlamaPoolingType::Rank,
        _ => LlamaPoolingType::None,
    };
    let causal = meta(model, &format!("{architecture}.attention.causal")).is_none_or(|v| v != "false");
    let vocab = model.vocab();
    ModelMeta {
        train_ctx: model.n_ctx_train(),
        n_vocab: model.n_vocab(),
        n_embd: model.n_embd(),
        chat_template: meta(model, "tokenizer.chat_template"),
        bos_token: token_text(model, vocab.bos()),
        eos_token: token_text(model, vocab.eos()),
        pooling,
        is_encoder: !causal,
        size_bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        n_params: model.n_params(),
        sampling_defaults: sampling_defaults(model),
        architecture,
    }
}

/// The model's vocabulary for constrained decoding, as llama.cpp's own llguidance sampler reads
/// it: a token's text without special rendering; a token with none is a control token, named by
/// its special rendering (or unused when that is empty too). The end tokens are every
/// end-of-generation id, end of turn first (what chat models end with).
pub fn grammar_vocabulary(model: &LlamaModel) -> Result<Vocabulary, VocabularyError> {
    let vocab = model.vocab();
    let n = model.n_vocab().max(0);
    let mut tokens = Vec::with_capacity(n as usize);
    let mut ends = Vec::new();
    for id in 0..n {
        let t = LlamaToken(id);
        let text = vocab.token_to_piece(t, false, None);
        tokens.push(if !text.is_empty() {
            TokenBytes::Text(text)
        } else {
            match vocab.token_to_piece(t, true, None) {
                name if name.is_empty() => TokenBytes::Unused,
                name => TokenBytes::Special(String::from_utf8_lossy(&name).into_owned()),
            }
        });
        if vocab.is_eog(t) {
            ends.push(id as u32);
        }
    }
    let first = [vocab.eot(), vocab.eos()].into_iter().find(|t| t.0 >= 0 && ends.contains(&(t.0 as u32)));
    if let Some(first) = first {
        ends.retain(|&e| e != first.0 as u32);
        ends.insert(0, first.0 as u32);
    }
    Vocabulary::new(tokens, &ends)
}

/// The sampling settings the GGUF recommends (`general.sampling.*`, as llama.cpp's converter
/// writes them from the model's generation config); `None` when it has none.
fn sampling_defaults(model: &LlamaModel) -> Option<SamplingDefaults> {
    let float = |key: &str| meta(model, &format!("general.sampling.{key}")).and_then(|v| v.parse::<f32>().ok());
    let defaults = SamplingDefaults {
        temperature: float("temp"),
        top_p: float("top_p"),
        top_k: meta(model, "general.sampling.top_k").and_then(|v| v.parse::<u32>().ok()),
        min_p: float("min_p"),
        repeat_penalty: float("penalty_repeat"),
    };
    (!defaults.is_empty()).then_some(defaults)
}

/// The sliding window of the model's windowed attention layers, in tokens (GGUF
/// `{arch}.attention.sliding_window`); 0 for a model without one.
pub fn sliding_window(model: &LlamaModel) -> u32 {
    let arch = meta(model, "general.architecture").unwrap_or_default();
    meta(model, &format!("{arch}.attention.sliding_window")).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Architectures whose cache llama.cpp can shift (its `llama_memory_can_shift`, which the
/// bindings do not expose, and a shift it cannot do aborts the process): the plain attention
/// cache, or the sliding-window pair when full-size. Any other architecture (recurrent, hybrid,
/// multi-axis positions, the compressed caches of the DeepSeek family) is left out.
const SHIFTABLE: &[&str] = &[
    "llama",
    "qwen2",
    "qwen2moe",
    "qwen3",
    "qwen3moe",
    "gemma",
    "gemma2",
    "gemma3",
    "phi3",
    "granite",
    "olmo2",
    "gpt-oss",
    "smollm3",
    "mistral3",
    "starcoder2",
    "stablelm",
];

/// Whether llama.cpp can drop a middle range of this model's cached positions and move the rest
/// down.
pub fn can_shift(model: &LlamaModel) -> bool {
    let arch = meta(model, "general.architecture").unwrap_or_default();
    SHIFTABLE.contains(&arch.as_str()) && !model.is_recurrent() && !model.is_hybrid()
}

/// Middle eviction needs a shiftable cache that holds every position: a sliding-window cache
/// that is window-sized (`swa_full` off) is not.
pub fn evicts_middle(shiftable: bool, n_swa: u32, swa_full: bool) -> bool {
    shiftable && (n_swa == 0 || swa_full)
}

/// Tokenizes with the model's own tokenizer.
pub fn tokenize(model: &LlamaModel, text: &str, add_bos: bool, parse_special: bool) -> Vec<LlamaToken> {
    model.vocab().tokenize(text.as_bytes(), add_bos, parse_special)
}

pub fn pooling_name(p: LlamaPoolingType) -> &'static str {
    match p {
        LlamaPoolingType::Mean => "mean",
        LlamaPoolingType::Cls => "cls",
        LlamaPoolingType::Last => "last",
        LlamaPoolingType::Rank => "rank",
        _ => "none",
    }
}
