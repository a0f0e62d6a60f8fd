//! Gemma 3, text only (`gemma3_text`, `Gemma3ForCausalLM`), as transformers' `modeling_gemma3`
//! computes it (`tests/goldens/README.md` has the math):
//!
//! - embeddings times `sqrt(hidden)`, that factor first rounded to the weights' type;
//! - RMS norms `x / rms · (1 + w)` (weights stored zero-centred), sandwiching both halves of a
//!   layer: `h = x + post_attn_norm(attn(input_norm(x)))`,
//!   `x = h + post_ff_norm(mlp(pre_ff_norm(h)))`;
//! - per-head RMS norms of q and k (over head_dim) before RoPE, scores scaled by
//!   `query_pre_attn_scalar^-0.5`; no attention softcapping (Gemma 3 ignores
//!   `attn_logit_softcapping`);
//! - sliding-window layers see their last `sliding_window` positions and rotate with
//!   `rope_local_base_freq` unscaled; full layers see everything and rotate with `rope_theta` and
//!   `rope_scaling`;
//! - a GeGLU MLP `down(gelu_tanh(gate(x)) · up(x))`; `final_logit_softcapping` when set; tied
//!   embeddings unless config.json says otherwise.
//!
//! The KV cache keeps every position of sliding layers too (as for full layers); only the
//! attention skips what lies outside the window. Bounding their memory to the window is left
//! for later.

use super::{
    attention_shape, embed_tokens, finish, linear, vector, AttentionWeights, BatchToken, Ends, Output, Scratch,
};
use crate::checkpoint::{Checkpoint, CheckpointError, DType};
use crate::config::{LayerAttention, ModelConfig};
use crate::kernels::linear::{forward_many, Linear};
use crate::kernels::ops::{add, gelu_tanh_mul, rms_norm_gemma, rms_norm_gemma_in_place, scale, softcap};
use crate::kv_cache::{BlockTable, KvPool};
use crate::rope::{Rope, RopeScaling};

struct Layer {
    sliding: bool,
    input_norm: Vec<f32>,
    attn: AttentionWeights,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    pre_ff_norm: Vec<f32>,
    post_ff_norm: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
}

pub struct Gemma3 {
    config: ModelConfig,
    /// Tied embeddings unless config.json says otherwise (Gemma3TextConfig's default).
    ends: Ends,
    /// `sqrt(hidden)` rounded to the embedding's type (`Gemma3TextScaledWordEmbedding`).
    embed_scale: f32,
    layers: Vec<Layer>,
    /// Sliding layers: `rope_local_base_freq`, no scaling.
    rope_local: Rope,
    /// Full layers: `rope_theta` with `rope_scaling`.
    rope_global: Rope,
}

/// transformers keeps `sqrt(hidden)` as an f32 tensor and casts it to the weights' type before
/// multiplying (`embed_scale.to(self.weight.dtype)`): 25.25 rather than 25.298 for a bf16
/// gemma-3-270m (hidden 640).
pub(crate) fn embed_scale(hidden: usize, dtype: DType) -> f32 {
    let s = (hidden as f64).sqrt() as f32;
    match dtype {
        DType::BF16 => half::bf16::from_f32(s).to_f32(),
        DType::F16 => half::f16::from_f32(s).to_f32(),
        DType::F32 => s,
    }
}

impl Gemma3 {
    pub fn load(c: &ModelConfig, ck: &Checkpoint) -> Result<Self, CheckpointError> {
        let (d, hd) = (c.hidden, c.head_dim);
        let ends = Ends::load(ck, c)?;
        let embed_scale = embed_scale(d, ends.embed.dtype());
        let layers = (0..c.layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let attn = format!("{p}.self_attn");
                Ok(Layer {
                    sliding: c.layer_attention[i] == LayerAttention::Sliding,
                    input_norm: vector(ck, &format!("{p}.input_layernorm.weight"), d)?,
                    attn: AttentionWeights::load(ck, c, &attn)?,
                    q_norm: vector(ck, &format!("{attn}.q_norm.weight"), hd)?,
                    k_norm: vector(ck, &format!("{attn}.k_norm.weight"), hd)?,
                    post_attn_norm: vector(ck, &format!("{p}.post_attention_layernorm.weight"), d)?,
                    pre_ff_norm: vector(ck, &format!("{p}.pre_feedforward_layernorm.weight"), d)?,
                    post_ff_norm: vector(ck, &format!("{p}.post_feedforward_layernorm.weight"), d)?,
                    gate: linear(ck, c, &format!("{p}.mlp.gate_proj"), c.intermediate, d, false)?,
                    up: linear(ck, c, &format!("{p}.mlp.up_proj"), c.intermediate, d, false)?,
                    down: linear(ck, c, &format!("{p}.mlp.down_proj"), d, c.intermediate, false)?,
                })
            })
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        Ok(Gemma3 {
            ends,
            embed_scale,
            layers,
            rope_local: Rope::new(hd, c.rope_local_theta, &RopeScaling::None),
            rope_global: Rope::new(hd, c.rope_theta, &c.rope_scaling),
            config: c.clone(),
        })
    }

    pub fn forward(
        &self,
        pool: &mut KvPool,
        tables: &[&BlockTable],
        batch: &[BatchToken],
        s: &mut Scratch,
        output: Output,
    ) -> Vec<f32> {
        let c = &self.config;
        let (n, d, eps) = (batch.len(), c.hidden, c.rms_eps);
        embed_tokens(&self.ends.embed, batch, d, &mut s.x);
        scale(&mut s.x, self.embed_scale);
        let shape = attention_shape(c, None);
        for (li, l) in self.layers.iter().enumerate() {
            rms_norm_gemma(&s.x, &l.input_norm, eps, &mut s.h);
            let rope = if l.sliding { &self.rope_local } else { &self.rope_global };
            // A sliding layer's query at p sees p - window < j <= p.
            let window = if l.sliding { c.sliding_window } else { usize::MAX };
            // q/k norms over each head, before the layer type's rotation.
            let qk_norms = |q: &mut [f32], k: &mut [f32]| {
                rms_norm_gemma_in_place(q, &l.q_norm, eps);
                rms_norm_gemma_in_place(k, &l.k_norm, eps);
            };
            l.attn.forward((&mut *pool, tables), li, batch, rope, window, &shape, s, qk_norms);
            rms_norm_gemma(&s.o, &l.post_attn_norm, eps, &mut s.h);
            add(&mut s.x, &s.h);
            rms_norm_gemma(&s.x, &l.pre_ff_norm, eps, &mut s.h);
            forward_many(&mut [(&l.gate, &mut s.gate), (&l.up, &mut s.up)], &s.h, n);
            gelu_tanh_mul(&mut s.gate, &s.up);
            l.down.forward(&s.gate, n, &mut s.o);
            rms_norm_gemma(&s.o, &l.post_ff_norm, eps, &mut s.h);
            add(&mut s.x, &s.h);
        }
        let norm = |x: &[f32], out: &mut Vec<f32>| rms_norm_gemma(x, &self.ends.norm, eps, out);
        let mut out = finish(batch, d, s, output, norm, self.ends.head());
        if let (Output::Logits, Some(cap)) = (output, c.final_logit_softcap) {
            softcap(&mut out, cap);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedding_scale_is_rounded_to_the_weights_type() {
        assert_eq!(embed_scale(640, DType::BF16), 25.25);
        assert_eq!(embed_scale(640, DType::F32), 640f32.sqrt());
        assert_eq!(embed_scale(64, DType::BF16), 8.0);
        assert_eq!(embed_scale(1152, DType::F16), half::f16::from_f32(1152f32.sqrt()).to_f32());
    }
}
