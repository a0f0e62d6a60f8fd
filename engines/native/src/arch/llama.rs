//! Llama-family decoders (`llama`, `qwen2`): pre-norm blocks of grouped-query attention with
//! rotary positions and a SwiGLU MLP, RMS norms, optionally tied embeddings; qwen2 adds biases
//! to the q/k/v projections.

use super::{
    attention_shape, embed_tokens, finish, linear, vector, AttentionWeights, BatchToken, Ends, Output, Scratch,
};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::kernels::linear::{forward_many, Linear};
use crate::kernels::ops::{add, rms_norm, silu_mul};
use crate::kv_cache::{BlockTable, KvPool};
use crate::rope::Rope;

struct Layer {
    input_norm: Vec<f32>,
    attn: AttentionWeights,
    post_norm: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
}

pub struct Llama {
    config: ModelConfig,
    ends: Ends,
    layers: Vec<Layer>,
    rope: Rope,
}

impl Llama {
    pub fn load(c: &ModelConfig, ck: &Checkpoint) -> Result<Self, CheckpointError> {
        let (d, hd) = (c.hidden, c.head_dim);
        let layers = (0..c.layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Layer {
                    input_norm: vector(ck, &format!("{p}.input_layernorm.weight"), d)?,
                    attn: AttentionWeights::load(ck, c, &format!("{p}.self_attn"))?,
                    post_norm: vector(ck, &format!("{p}.post_attention_layernorm.weight"), d)?,
                    gate: linear(ck, c, &format!("{p}.mlp.gate_proj"), c.intermediate, d, c.mlp_bias)?,
                    up: linear(ck, c, &format!("{p}.mlp.up_proj"), c.intermediate, d, c.mlp_bias)?,
                    down: linear(ck, c, &format!("{p}.mlp.down_proj"), d, c.intermediate, c.mlp_bias)?,
                })
            })
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        Ok(Llama {
            ends: Ends::load(ck, c)?,
            layers,
            rope: Rope::new(hd, c.rope_theta, &c.rope_scaling),
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
        let (n, d) = (batch.len(), c.hidden);
        embed_tokens(&self.ends.embed, batch, d, &mut s.x);
        let shape = attention_shape(c, None);
        for (li, l) in self.layers.iter().enumerate() {
            rms_norm(&s.x, &l.input_norm, c.rms_eps, &mut s.h);
            l.attn.forward((&mut *pool, tables), li, batch, &self.rope, usize::MAX, &shape, s, |_, _| {});
            add(&mut s.x, &s.o);
            rms_norm(&s.x, &l.post_norm, c.rms_eps, &mut s.h);
            forward_many(&mut [(&l.gate, &mut s.gate), (&l.up, &mut s.up)], &s.h, n);
            silu_mul(&mut s.gate, &s.up);
            l.down.forward(&s.gate, n, &mut s.o);
            add(&mut s.x, &s.o);
        }
        let norm = |x: &[f32], out: &mut Vec<f32>| rms_norm(x, &self.ends.norm, c.rms_eps, out);
        finish(batch, d, s, output, norm, self.ends.head())
    }
}
