//! The model's `config.json`, as Hugging Face `transformers` reads it, turned into the shape
//! the forward pass needs. Unknown architectures and inconsistent sizes are refused here, at
//! load, with the field named.

use crate::rope::RopeScaling;
use serde::Deserialize;
use std::path::Path;

/// The architectures this engine runs (one file each under `arch/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `llama` (SmolLM2, Llama 2/3, Mistral-style dense models without sliding windows).
    Llama,
    /// `qwen2`: llama with biases on the q/k/v projections.
    Qwen2,
}

/// Every architecture name the plugin accepts, as `config.json`'s `model_type` spells it.
pub const SUPPORTED: &[&str] = &["llama", "qwen2"];

impl Arch {
    fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" => Some(Self::Llama),
            "qwen2" => Some(Self::Qwen2),
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    hidden_act: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
}

fn default_eps() -> f32 {
    1e-6
}
fn default_theta() -> f32 {
    10_000.0
}

/// What the forward pass needs to know about a model.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub model_type: String,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub context_length: usize,
    pub tie_embeddings: bool,
    /// Biases on the q/k/v projections.
    pub qkv_bias: bool,
    /// A bias on the output projection and the MLP (llama's `attention_bias` / `mlp_bias`).
    pub o_bias: bool,
    pub mlp_bias: bool,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {message}")]
    Read { path: String, message: String },
    #[error("config.json names architecture '{0}', which this engine does not run (supported: {list})", list = SUPPORTED.join(", "))]
    Unsupported(String),
    #[error("config.json: {0}")]
    Invalid(String),
}

impl ModelConfig {
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { path: path.display().to_string(), message: e.to_string() })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let model_type = raw
            .model_type
            .clone()
            .or_else(|| raw.architectures.first().cloned())
            .ok_or_else(|| ConfigError::Invalid("neither model_type nor architectures is set".into()))?;
        let arch = Arch::from_model_type(&model_type).ok_or_else(|| ConfigError::Unsupported(model_type.clone()))?;
        if let Some(act) = raw.hidden_act.as_deref() {
            if act != "silu" {
                return Err(ConfigError::Invalid(format!(
                    "hidden_act '{act}' is not supported for {model_type} (silu)"
                )));
            }
        }
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        let positive = [
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv_heads),
            ("vocab_size", raw.vocab_size),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::Invalid(format!("{name} must be positive")));
        }
        if !heads.is_multiple_of(kv_heads) {
            return Err(ConfigError::Invalid(format!(
                "num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
            )));
        }
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / heads);
        if head_dim == 0
            || !head_dim.is_multiple_of(2)
            || (raw.head_dim.is_none() && !raw.hidden_size.is_multiple_of(heads))
        {
            return Err(ConfigError::Invalid(format!("head_dim {head_dim} does not fit hidden_size / heads")));
        }
        let context_length = raw.max_position_embeddings.unwrap_or(2048);
        let rope_scaling =
            RopeScaling::parse(raw.rope_scaling.as_ref(), context_length).map_err(ConfigError::Invalid)?;
        let eos = match raw.eos_token_id {
            None => Vec::new(),
            Some(OneOrMany::One(id)) => vec![id],
            Some(OneOrMany::Many(ids)) => ids,
        };
        Ok(ModelConfig {
            arch,
            model_type,
            hidden: raw.hidden_size,
            intermediate: raw.intermediate_size,
            layers: raw.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            vocab: raw.vocab_size,
            rms_eps: raw.rms_norm_eps,
            rope_theta: raw.rope_theta,
            rope_scaling,
            context_length,
            tie_embeddings: raw.tie_word_embeddings,
            qkv_bias: arch == Arch::Qwen2 || raw.attention_bias,
            o_bias: raw.attention_bias,
            mlp_bias: raw.mlp_bias,
            bos: raw.bos_token_id,
            eos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":576,
        "intermediate_size":1536,"num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,
        "vocab_size":49152,"rms_norm_eps":1e-5,"rope_theta":100000,"max_position_embeddings":8192,
        "tie_word_embeddings":true,"hidden_act":"silu","bos_token_id":1,"eos_token_id":2}"#;

    #[test]
    fn a_llama_config_reads_as_transformers_reads_it() {
        let c = ModelConfig::parse(SMOLLM2).unwrap();
        assert_eq!(c.arch, Arch::Llama);
        assert_eq!((c.hidden, c.heads, c.kv_heads, c.head_dim, c.layers), (576, 9, 3, 64, 30));
        assert_eq!(c.eos, vec![2]);
        assert!(c.tie_embeddings && !c.qkv_bias);
        assert_eq!(c.rope_theta, 100_000.0);
    }

    #[test]
    fn unsupported_and_inconsistent_configs_are_named() {
        let gemma = SMOLLM2.replace("\"llama\"", "\"bert\"");
        let e = ModelConfig::parse(&gemma).unwrap_err().to_string();
        assert!(e.contains("'bert'") && e.contains("llama, qwen2"), "{e}");
        let bad_heads = SMOLLM2.replace("\"num_key_value_heads\":3", "\"num_key_value_heads\":4");
        let e = ModelConfig::parse(&bad_heads).unwrap_err().to_string();
        assert!(e.contains("num_key_value_heads (4)"), "{e}");
        let zero = SMOLLM2.replace("\"num_hidden_layers\":30", "\"num_hidden_layers\":0");
        assert!(ModelConfig::parse(&zero).unwrap_err().to_string().contains("num_hidden_layers"));
    }
}
