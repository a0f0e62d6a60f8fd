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
    /// `gemma3_text` (Gemma 3 text-only, `Gemma3ForCausalLM`): sandwich norms `x·(1+w)`, q/k
    /// norms, GELU-tanh MLP, scaled embeddings, sliding-window and full layers.
    Gemma3,
    /// `gpt_oss` (gpt-oss-20b/120b): biased attention with learned sinks, alternating sliding and
    /// full layers, YaRN, and a mixture of experts whose weights are MXFP4 on disk.
    GptOss,
}

/// Every architecture name the plugin accepts, as `config.json`'s `model_type` spells it.
pub const SUPPORTED: &[&str] = &["llama", "qwen2", "gemma3_text", "gpt_oss"];

impl Arch {
    fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" => Some(Self::Llama),
            "qwen2" => Some(Self::Qwen2),
            "gemma3_text" => Some(Self::Gemma3),
            "gpt_oss" => Some(Self::GptOss),
            _ => None,
        }
    }
}

/// The MLP's activation (`hidden_act` / `hidden_activation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up`.
    Silu,
    /// GeGLU with PyTorch's tanh approximation (`gelu_pytorch_tanh`): `gelu_tanh(gate) · up`.
    GeluTanh,
}

/// Which keys a layer's queries see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerAttention {
    /// Every earlier position (plain causal).
    Full,
    /// The last `sliding_window` positions, the query's own included.
    Sliding,
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
    rope_theta: Option<f32>,
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: bool,
    hidden_act: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
    // Gemma 3 (`Gemma3TextConfig`; its defaults apply when a key is absent).
    // `attn_logit_softcapping` is not read: transformers' Gemma 3 attention ignores it.
    hidden_activation: Option<String>,
    query_pre_attn_scalar: Option<f64>,
    #[serde(default = "default_window")]
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    rope_local_base_freq: Option<f32>,
    final_logit_softcapping: Option<f32>,
    #[serde(default)]
    use_bidirectional_attention: bool,
    // gpt-oss (`GptOssConfig`).
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    quantization_config: Option<serde_json::Value>,
}

fn default_eps() -> f32 {
    1e-6
}
/// `Gemma3TextConfig`'s default window; an explicit null stays `None`.
fn default_window() -> Option<usize> {
    Some(4096)
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
    pub activation: Activation,
    /// Multiplies q·k: `1/sqrt(head_dim)`, Gemma 3's `query_pre_attn_scalar^-0.5`.
    pub attention_scale: f32,
    /// One entry per layer (all `Full` but for Gemma 3's sliding layers).
    pub layer_attention: Vec<LayerAttention>,
    /// Positions a `Sliding` layer's query sees, its own included (0 when no layer slides).
    pub sliding_window: usize,
    /// RoPE base of the sliding layers (Gemma 3's `rope_local_base_freq`; applied without
    /// `rope_scaling`). Full layers use `rope_theta` with `rope_scaling`.
    pub rope_local_theta: f32,
    /// `final_logit_softcapping`: logits become `c·tanh(logits/c)`.
    pub final_logit_softcap: Option<f32>,
    /// The mixture of experts of a gpt-oss model (`None` for dense MLPs).
    pub experts: Option<Experts>,
    /// Whether bf16 projections multiply their inputs rounded to bf16 where the CPU has
    /// AVX-512 BF16 (`kernels::linear`). Not from config.json: `read` turns it on, and the
    /// engine's `bf16_products` setting may turn it off.
    pub bf16_products: bool,
    /// Whether those products run on AMX tiles from `GEMM_MIN_ROWS` inputs on where the CPU
    /// has AMX (`kernels::amx_bf16`). Not from config.json either: the engine's `amx_products`
    /// setting may turn it off.
    pub amx_products: bool,
}

/// A mixture-of-experts MLP: each token runs `top_k` of `count` experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    pub count: usize,
    pub top_k: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {message}")]
    Read { path: String, message: String },
    #[error("config.json names architecture '{0}', which this engine does not run (supported: {list})", list = SUPPORTED.join(", "))]
    Unsupported(String),
    #[error("config.json: {0}")]
    Invalid(String),
    /// A model of a known family in a form this engine does not run yet (the reason is the message).
    #[error("config.json: {0}")]
    UnsupportedVariant(String),
}

impl ModelConfig {
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { path: path.display().to_string(), message: e.to_string() })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        // Multimodal Gemma 3 (`Gemma3ForConditionalGeneration`) nests its text model in
        // `text_config` beside a vision tower; refused by name before the sizes are looked for.
        if value.get("model_type").and_then(|v| v.as_str()) == Some("gemma3") || value.get("text_config").is_some() {
            let model_type = value.get("model_type").and_then(|v| v.as_str()).unwrap_or("?");
            return Err(ConfigError::UnsupportedVariant(format!(
                "model_type '{model_type}' is a multimodal checkpoint (text_config plus a vision tower); \
                 the native engine runs text-only models for now (Gemma 3: model_type gemma3_text, \
                 Gemma3ForCausalLM, as gemma-3-270m and gemma-3-1b ship)"
            )));
        }
        let raw: RawConfig = serde_json::from_value(value).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let model_type = raw
            .model_type
            .clone()
            .or_else(|| raw.architectures.first().cloned())
            .ok_or_else(|| ConfigError::Invalid("neither model_type nor architectures is set".into()))?;
        let arch = Arch::from_model_type(&model_type).ok_or_else(|| ConfigError::Unsupported(model_type.clone()))?;
        let gemma = arch == Arch::Gemma3;
        let oss = arch == Arch::GptOss;
        let experts = experts(&raw, oss)?;
        let activation = if gemma {
            // Gemma3TextConfig reads `hidden_activation` (default gelu_pytorch_tanh).
            match raw.hidden_activation.as_deref().unwrap_or("gelu_pytorch_tanh") {
                "gelu_pytorch_tanh" => Activation::GeluTanh,
                act => {
                    return Err(ConfigError::Invalid(format!(
                        "hidden_activation '{act}' is not supported for {model_type} (gelu_pytorch_tanh)"
                    )))
                }
            }
        } else {
            match raw.hidden_act.as_deref().unwrap_or("silu") {
                "silu" => Activation::Silu,
                act => {
                    return Err(ConfigError::Invalid(format!(
                        "hidden_act '{act}' is not supported for {model_type} (silu)"
                    )))
                }
            }
        };
        if gemma && raw.use_bidirectional_attention {
            return Err(ConfigError::UnsupportedVariant(
                "use_bidirectional_attention (an embedding model such as EmbeddingGemma) is not supported: \
                 the native engine runs causal decoders"
                    .into(),
            ));
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
        // Gemma3TextConfig's head_dim defaults to 256, not hidden / heads.
        let head_dim = raw.head_dim.unwrap_or(if gemma { 256 } else { raw.hidden_size / heads });
        if head_dim == 0
            || !head_dim.is_multiple_of(2)
            || (raw.head_dim.is_none() && !gemma && !raw.hidden_size.is_multiple_of(heads))
        {
            return Err(ConfigError::Invalid(format!("head_dim {head_dim} does not fit hidden_size / heads")));
        }
        let context_length = raw.max_position_embeddings.unwrap_or(2048);
        let rope_scaling =
            RopeScaling::parse(raw.rope_scaling.as_ref(), context_length).map_err(ConfigError::Invalid)?;
        let layers = raw.num_hidden_layers;
        let layer_attention: Vec<LayerAttention> = match (gemma || oss, &raw.layer_types) {
            (false, _) => vec![LayerAttention::Full; layers],
            (true, Some(types)) => {
                if types.len() != layers {
                    return Err(ConfigError::Invalid(format!(
                        "layer_types has {} entries for {layers} layers",
                        types.len()
                    )));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "sliding_attention" => Ok(LayerAttention::Sliding),
                        "full_attention" => Ok(LayerAttention::Full),
                        other => Err(ConfigError::Invalid(format!(
                            "layer_types: '{other}' is not sliding_attention or full_attention"
                        ))),
                    })
                    .collect::<Result<_, _>>()?
            }
            // Older configs: every `sliding_window_pattern`-th layer is full (transformers'
            // default pattern is 6 for Gemma 3; gpt-oss alternates, sliding first).
            (true, None) => {
                let pattern = raw.sliding_window_pattern.unwrap_or(if oss { 2 } else { 6 });
                if pattern == 0 {
                    return Err(ConfigError::Invalid("sliding_window_pattern must be positive".into()));
                }
                (0..layers)
                    .map(|i| if (i + 1) % pattern == 0 { LayerAttention::Full } else { LayerAttention::Sliding })
                    .collect()
            }
        };
        let slides = layer_attention.contains(&LayerAttention::Sliding);
        let sliding_window = match (slides, raw.sliding_window) {
            (false, _) => 0,
            (true, Some(w)) if w > 0 => w,
            (true, _) => {
                return Err(ConfigError::Invalid("sliding layers need a positive sliding_window".into()));
            }
        };
        let attention_scale = match (gemma, raw.query_pre_attn_scalar) {
            (true, scalar) => {
                let scalar = scalar.unwrap_or(256.0);
                if scalar.is_nan() || scalar <= 0.0 {
                    return Err(ConfigError::Invalid("query_pre_attn_scalar must be positive".into()));
                }
                scalar.powf(-0.5) as f32
            }
            (false, _) => 1.0 / (head_dim as f32).sqrt(),
        };
        let final_logit_softcap = match raw.final_logit_softcapping {
            Some(c) if c.is_nan() || c <= 0.0 => {
                return Err(ConfigError::Invalid(format!("final_logit_softcapping {c} must be positive")));
            }
            c => c,
        };
        let rope_theta = raw.rope_theta.unwrap_or(match arch {
            Arch::Gemma3 => 1_000_000.0,
            Arch::GptOss => 150_000.0,
            Arch::Llama | Arch::Qwen2 => 10_000.0,
        });
        // GptOssConfig's attention has biases by default; LlamaConfig's does not.
        let attention_bias = raw.attention_bias.unwrap_or(oss);
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
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab: raw.vocab_size,
            rms_eps: raw.rms_norm_eps,
            rope_theta,
            rope_scaling,
            context_length,
            // Gemma3TextConfig ties by default, LlamaConfig and Qwen2Config do not.
            tie_embeddings: raw.tie_word_embeddings.unwrap_or(gemma),
            qkv_bias: arch == Arch::Qwen2 || attention_bias,
            o_bias: attention_bias,
            mlp_bias: raw.mlp_bias && !gemma,
            bos: raw.bos_token_id,
            eos,
            activation,
            attention_scale,
            layer_attention,
            sliding_window,
            rope_local_theta: raw.rope_local_base_freq.unwrap_or(10_000.0),
            final_logit_softcap,
            experts,
            bf16_products: true,
            amx_products: true,
        })
    }
}

/// The experts of a gpt-oss config, which must be MXFP4 as OpenAI ships them; any other
/// architecture must not name a quantization this engine does not read.
fn experts(raw: &RawConfig, oss: bool) -> Result<Option<Experts>, ConfigError> {
    let method =
        raw.quantization_config.as_ref().map(|q| q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("?"));
    if !oss {
        return match method {
            None => Ok(None),
            Some(m) => Err(ConfigError::UnsupportedVariant(format!(
                "quantization_config names quant_method '{m}'; the native engine reads bf16, f16 and f32 \
                 weights (and MXFP4 gpt-oss experts)"
            ))),
        };
    }
    if method != Some("mxfp4") {
        return Err(ConfigError::UnsupportedVariant(format!(
            "gpt_oss experts must be MXFP4 as OpenAI ships them (quantization_config.quant_method 'mxfp4'); \
             this config has {}",
            method.map_or("no quantization_config".to_string(), |m| format!("quant_method '{m}'"))
        )));
    }
    let count = raw.num_local_experts.ok_or_else(|| ConfigError::Invalid("gpt_oss needs num_local_experts".into()))?;
    let top_k = raw.num_experts_per_tok.unwrap_or(4);
    if count == 0 || top_k == 0 || top_k > count {
        return Err(ConfigError::Invalid(format!(
            "num_experts_per_tok ({top_k}) must be between 1 and num_local_experts ({count})"
        )));
    }
    // MXFP4 groups 32 weights of an input row under one exponent.
    for (name, size) in [("hidden_size", raw.hidden_size), ("intermediate_size", raw.intermediate_size)] {
        if !size.is_multiple_of(32) {
            return Err(ConfigError::Invalid(format!("{name} ({size}) must be a multiple of 32 for MXFP4 experts")));
        }
    }
    Ok(Some(Experts { count, top_k }))
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

    /// gemma-3-270m's config.json (as Hugging Face ships it, `layer_types` included).
    const GEMMA3_270M: &str = r#"{"architectures":["Gemma3ForCausalLM"],"attention_bias":false,
        "attn_logit_softcapping":null,"bos_token_id":2,"eos_token_id":1,"final_logit_softcapping":null,
        "head_dim":256,"hidden_activation":"gelu_pytorch_tanh","hidden_size":640,"intermediate_size":2048,
        "layer_types":["sliding_attention","sliding_attention","sliding_attention","sliding_attention",
        "sliding_attention","full_attention","sliding_attention","sliding_attention","sliding_attention",
        "sliding_attention","sliding_attention","full_attention","sliding_attention","sliding_attention",
        "sliding_attention","sliding_attention","sliding_attention","full_attention"],
        "max_position_embeddings":32768,"model_type":"gemma3_text","num_attention_heads":4,
        "num_hidden_layers":18,"num_key_value_heads":1,"pad_token_id":0,"query_pre_attn_scalar":256,
        "rms_norm_eps":1e-06,"rope_local_base_freq":10000.0,"rope_scaling":null,"rope_theta":1000000.0,
        "sliding_window":512,"sliding_window_pattern":6,"tie_word_embeddings":true,
        "use_bidirectional_attention":false,"vocab_size":262144}"#;

    #[test]
    fn a_gemma3_config_reads_as_transformers_reads_it() {
        let c = ModelConfig::parse(GEMMA3_270M).unwrap();
        assert_eq!(c.arch, Arch::Gemma3);
        assert_eq!((c.hidden, c.heads, c.kv_heads, c.head_dim, c.layers), (640, 4, 1, 256, 18));
        assert_eq!(c.activation, Activation::GeluTanh);
        assert_eq!(c.attention_scale, 1.0 / 16.0);
        assert_eq!(c.sliding_window, 512);
        assert_eq!((c.rope_theta, c.rope_local_theta), (1e6, 1e4));
        assert!(c.tie_embeddings && !c.qkv_bias && c.final_logit_softcap.is_none());
        let full: Vec<usize> = (0..18).filter(|&i| c.layer_attention[i] == LayerAttention::Full).collect();
        assert_eq!(full, [5, 11, 17]);
        // Without layer_types, sliding_window_pattern says the same; the defaults of
        // Gemma3TextConfig fill what is left out (head_dim 256, tied, pattern 6, window 4096).
        let mut v: serde_json::Value = serde_json::from_str(GEMMA3_270M).unwrap();
        let o = v.as_object_mut().unwrap();
        for key in ["layer_types", "head_dim", "tie_word_embeddings", "query_pre_attn_scalar", "sliding_window"] {
            o.remove(key);
        }
        o.insert("sliding_window_pattern".into(), 3.into());
        o.insert("final_logit_softcapping".into(), 30.0.into());
        let d = ModelConfig::parse(&v.to_string()).unwrap();
        assert_eq!((d.head_dim, d.sliding_window, d.attention_scale), (256, 4096, 1.0 / 16.0));
        assert!(d.tie_embeddings);
        assert_eq!(d.final_logit_softcap, Some(30.0));
        let full: Vec<usize> = (0..18).filter(|&i| d.layer_attention[i] == LayerAttention::Full).collect();
        assert_eq!(full, [2, 5, 8, 11, 14, 17]);
        // llama keeps its own defaults: every layer full, 1/sqrt(head_dim).
        let l = ModelConfig::parse(SMOLLM2).unwrap();
        assert!(l.layer_attention.iter().all(|a| *a == LayerAttention::Full) && l.sliding_window == 0);
        assert_eq!((l.activation, l.attention_scale), (Activation::Silu, 0.125));
    }

    #[test]
    fn gemma3_variants_the_engine_does_not_run_are_refused_with_a_reason() {
        let multimodal = r#"{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3",
            "text_config":{"model_type":"gemma3_text","hidden_size":2560},"vision_config":{"model_type":"siglip_vision_model"}}"#;
        let e = ModelConfig::parse(multimodal).unwrap_err();
        assert!(matches!(e, ConfigError::UnsupportedVariant(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("'gemma3'") && e.contains("text_config") && e.contains("gemma3_text"), "{e}");
        let bidirectional =
            GEMMA3_270M.replace("\"use_bidirectional_attention\":false", "\"use_bidirectional_attention\":true");
        assert!(matches!(ModelConfig::parse(&bidirectional), Err(ConfigError::UnsupportedVariant(_))));
        let short = GEMMA3_270M.replace("\"full_attention\"],", "\"full_attention\",\"full_attention\"],");
        let e = ModelConfig::parse(&short).unwrap_err().to_string();
        assert!(e.contains("layer_types has 19 entries for 18 layers"), "{e}");
        let gelu = GEMMA3_270M.replace("gelu_pytorch_tanh", "relu");
        assert!(ModelConfig::parse(&gelu).unwrap_err().to_string().contains("hidden_activation 'relu'"));
        let no_window = GEMMA3_270M.replace("\"sliding_window\":512", "\"sliding_window\":null");
        assert!(ModelConfig::parse(&no_window).unwrap_err().to_string().contains("sliding_window"));
    }

    #[test]
    fn unsupported_and_inconsistent_configs_are_named() {
        let gemma = SMOLLM2.replace("\"llama\"", "\"bert\"");
        let e = ModelConfig::parse(&gemma).unwrap_err().to_string();
        assert!(e.contains("'bert'") && e.contains("llama, qwen2, gemma3_text, gpt_oss"), "{e}");
        let bad_heads = SMOLLM2.replace("\"num_key_value_heads\":3", "\"num_key_value_heads\":4");
        let e = ModelConfig::parse(&bad_heads).unwrap_err().to_string();
        assert!(e.contains("num_key_value_heads (4)"), "{e}");
        let zero = SMOLLM2.replace("\"num_hidden_layers\":30", "\"num_hidden_layers\":0");
        assert!(ModelConfig::parse(&zero).unwrap_err().to_string().contains("num_hidden_layers"));
    }

    /// The keys of gpt-oss-20b's config.json the engine reads (`layer_types` left out: the
    /// default alternation, sliding first, must give the same layers).
    const GPT_OSS_20B: &str = r#"{"architectures":["GptOssForCausalLM"],"model_type":"gpt_oss",
        "attention_bias":true,"eos_token_id":200002,"experts_per_token":4,"head_dim":64,"hidden_act":"silu",
        "hidden_size":2880,"intermediate_size":2880,"max_position_embeddings":131072,"num_attention_heads":64,
        "num_experts_per_tok":4,"num_hidden_layers":24,"num_key_value_heads":8,"num_local_experts":32,
        "quantization_config":{"modules_to_not_convert":["model.layers.*.self_attn","model.layers.*.mlp.router",
        "model.embed_tokens","lm_head"],"quant_method":"mxfp4"},"rms_norm_eps":1e-05,
        "rope_scaling":{"beta_fast":32.0,"beta_slow":1.0,"factor":32.0,"original_max_position_embeddings":4096,
        "rope_type":"yarn","truncate":false},"rope_theta":150000,"sliding_window":128,"swiglu_limit":7.0,
        "tie_word_embeddings":false,"vocab_size":201088}"#;

    #[test]
    fn a_gpt_oss_config_reads_as_transformers_reads_it() {
        let c = ModelConfig::parse(GPT_OSS_20B).unwrap();
        assert_eq!(c.arch, Arch::GptOss);
        assert_eq!((c.hidden, c.heads, c.kv_heads, c.head_dim, c.layers), (2880, 64, 8, 64, 24));
        assert_eq!(c.experts, Some(Experts { count: 32, top_k: 4 }));
        assert!(c.qkv_bias && c.o_bias && !c.tie_embeddings);
        assert_eq!((c.sliding_window, c.attention_scale), (128, 0.125));
        let sliding: Vec<bool> = c.layer_attention.iter().map(|a| *a == LayerAttention::Sliding).collect();
        assert_eq!(sliding, (0..24).map(|i| i % 2 == 0).collect::<Vec<_>>());
        assert!(matches!(c.rope_scaling, RopeScaling::Yarn { factor: 32.0, truncate: false, .. }));
        // Experts in any form but MXFP4 are refused with the reason; so is a bad top-k.
        let bf16 = GPT_OSS_20B.replace("\"quant_method\":\"mxfp4\"", "\"quant_method\":\"none\"");
        let e = ModelConfig::parse(&bf16).unwrap_err();
        assert!(matches!(e, ConfigError::UnsupportedVariant(_)) && e.to_string().contains("'none'"), "{e}");
        let k = GPT_OSS_20B.replace("\"num_experts_per_tok\":4", "\"num_experts_per_tok\":33");
        assert!(ModelConfig::parse(&k).unwrap_err().to_string().contains("num_experts_per_tok (33)"));
    }

    #[test]
    fn a_quantized_dense_checkpoint_is_refused_by_its_method() {
        let gptq =
            SMOLLM2.replace("\"silu\",", "\"silu\",\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4},");
        let e = ModelConfig::parse(&gptq).unwrap_err();
        assert!(matches!(e, ConfigError::UnsupportedVariant(_)) && e.to_string().contains("'gptq'"), "{e}");
    }
}
