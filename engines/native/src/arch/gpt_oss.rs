//! gpt-oss (`gpt_oss`, `GptOssForCausalLM`), as transformers' `modeling_gpt_oss` computes it:
//! - llama-style pre-norm blocks (RMS norms `x·w`), attention with biases on q/k/v/o and one
//!   learned **sink** logit per query head, which joins each softmax's denominator and carries no
//!   value;
//! - layers alternating sliding-window and full attention (`layer_types`), one YaRN rotation for
//!   both (its attention factor scales cos and sin);
//! - a **mixture of experts** in place of the MLP: a biased router picks the top-k experts of
//!   each token, weighted by a softmax over the chosen logits only; an expert is
//!   `down((clamp(up, ±7) + 1) · g·sigmoid(1.702·g))` with `g = min(gate, 7)`, its gate and up
//!   rows interleaved in one `gate_up` projection;
//! - expert weights read straight from their MXFP4 blocks on disk (`kernels::mxfp4`): a 20B
//!   model's experts stay about 4.25 bits a weight in memory.

use super::{
    attention_shape, embed_tokens, finish, linear, vector, AttentionWeights, BatchToken, Ends, Output, Scratch,
};
use crate::checkpoint::{ByteTensor, Checkpoint, CheckpointError};
use crate::config::{LayerAttention, ModelConfig};
use crate::kernels::linear::Linear;
use crate::kernels::mxfp4::Mxfp4;
use crate::kernels::ops::{add, rms_norm};
use crate::kv_cache::{BlockTable, KvPool};
use crate::rope::Rope;

/// transformers clamps the expert activations at 7 in its CPU path whatever `swiglu_limit` says
/// (only its GPU MXFP4 kernel reads that key); released configs say 7 too.
const SWIGLU_LIMIT: f32 = 7.0;
/// The slope of the expert's sigmoid gate.
const SWIGLU_ALPHA: f32 = 1.702;

/// One MXFP4 matrix per expert: `[experts, rows, cols / 32, 16]` blocks and
/// `[experts, rows, cols / 32]` exponents, plus a bias `[experts, rows]`.
struct ExpertMatrices {
    blocks: ByteTensor,
    scales: ByteTensor,
    bias: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl ExpertMatrices {
    fn load(ck: &Checkpoint, name: &str, experts: usize, rows: usize, cols: usize) -> Result<Self, CheckpointError> {
        let groups = cols / 32;
        let m = ExpertMatrices {
            blocks: ck.get_bytes(&format!("{name}_blocks"), &[experts, rows, groups, 16])?,
            scales: ck.get_bytes(&format!("{name}_scales"), &[experts, rows, groups])?,
            bias: ck.get(&format!("{name}_bias"), &[experts, rows])?.to_f32(),
            rows,
            cols,
        };
        Ok(m)
    }

    fn expert(&self, e: usize) -> Mxfp4<'_> {
        let (block_len, scale_len) = (self.rows * self.cols / 2, self.rows * self.cols / 32);
        let blocks = &self.blocks.bytes()[e * block_len..(e + 1) * block_len];
        let scales = &self.scales.bytes()[e * scale_len..(e + 1) * scale_len];
        Mxfp4::new(blocks, scales, self.rows, self.cols).expect("shapes checked at load")
    }

    /// `y = W_e x + b_e` for the `n` rows of `x`.
    fn forward(&self, e: usize, x: &[f32], n: usize, y: &mut Vec<f32>) {
        y.clear();
        y.resize(n * self.rows, 0.0);
        self.expert(e).matmul(x, n, y);
        let bias = &self.bias[e * self.rows..(e + 1) * self.rows];
        for row in y.chunks_exact_mut(self.rows) {
            add(row, bias);
        }
    }
}

struct Moe {
    router: Linear,
    gate_up: ExpertMatrices,
    down: ExpertMatrices,
    top_k: usize,
}

/// Buffers of one expert's pass.
#[derive(Default)]
struct ExpertScratch {
    x: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    y: Vec<f32>,
}

impl Moe {
    /// Each token's chosen experts and their weights: `top_k` pairs per token.
    fn route(&self, h: &[f32], n: usize, logits: &mut Vec<f32>) -> Vec<(usize, f32)> {
        self.router.forward(h, n, logits);
        let experts = self.router.rows;
        let mut chosen = Vec::with_capacity(n * self.top_k);
        let mut order: Vec<usize> = Vec::with_capacity(experts);
        for row in logits.chunks_exact(experts) {
            order.clear();
            order.extend(0..experts);
            // Highest logit first; equal logits keep the lower index first.
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let top = &order[..self.top_k];
            let max = row[top[0]];
            let sum: f32 = top.iter().map(|&e| (row[e] - max).exp()).sum();
            chosen.extend(top.iter().map(|&e| (e, (row[e] - max).exp() / sum)));
        }
        chosen
    }

    /// `out` (`n x hidden`) = each token's weighted sum of its experts' outputs. The tokens that
    /// chose an expert run through it together, so a prefill chunk reads each expert once.
    fn forward(&self, h: &[f32], n: usize, out: &mut Vec<f32>, logits: &mut Vec<f32>) {
        let d = self.down.rows;
        let inter = self.down.cols;
        let chosen = self.route(h, n, logits);
        out.clear();
        out.resize(n * d, 0.0);
        let mut s = ExpertScratch::default();
        let mut members: Vec<(usize, f32)> = Vec::new();
        for e in 0..self.router.rows {
            members.clear();
            members.extend(
                chosen.iter().enumerate().filter(|(_, &(x, _))| x == e).map(|(i, &(_, w))| (i / self.top_k, w)),
            );
            if members.is_empty() {
                continue;
            }
            let m = members.len();
            s.x.clear();
            for &(t, _) in &members {
                s.x.extend_from_slice(&h[t * d..(t + 1) * d]);
            }
            self.gate_up.forward(e, &s.x, m, &mut s.gate_up);
            s.act.clear();
            s.act.extend(s.gate_up.chunks_exact(2).map(|gu| {
                let gate = gu[0].min(SWIGLU_LIMIT);
                let up = gu[1].clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT);
                (up + 1.0) * gate / (1.0 + (-SWIGLU_ALPHA * gate).exp())
            }));
            debug_assert_eq!(s.act.len(), m * inter);
            self.down.forward(e, &s.act, m, &mut s.y);
            for (&(t, w), y) in members.iter().zip(s.y.chunks_exact(d)) {
                for (o, v) in out[t * d..(t + 1) * d].iter_mut().zip(y) {
                    *o += w * v;
                }
            }
        }
    }
}

struct Layer {
    sliding: bool,
    input_norm: Vec<f32>,
    attn: AttentionWeights,
    sinks: Vec<f32>,
    post_norm: Vec<f32>,
    moe: Moe,
}

pub struct GptOss {
    config: ModelConfig,
    ends: Ends,
    layers: Vec<Layer>,
    rope: Rope,
}

impl GptOss {
    pub fn load(c: &ModelConfig, ck: &Checkpoint) -> Result<Self, CheckpointError> {
        let (d, hd) = (c.hidden, c.head_dim);
        let experts = c.experts.expect("config.rs gives every gpt_oss config its experts");
        let layers = (0..c.layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let attn = format!("{p}.self_attn");
                Ok(Layer {
                    sliding: c.layer_attention[i] == LayerAttention::Sliding,
                    input_norm: vector(ck, &format!("{p}.input_layernorm.weight"), d)?,
                    attn: AttentionWeights::load(ck, c, &attn)?,
                    sinks: vector(ck, &format!("{attn}.sinks"), c.heads)?,
                    post_norm: vector(ck, &format!("{p}.post_attention_layernorm.weight"), d)?,
                    moe: Moe {
                        router: linear(ck, c, &format!("{p}.mlp.router"), experts.count, d, true)?,
                        gate_up: ExpertMatrices::load(
                            ck,
                            &format!("{p}.mlp.experts.gate_up_proj"),
                            experts.count,
                            2 * c.intermediate,
                            d,
                        )?,
                        down: ExpertMatrices::load(
                            ck,
                            &format!("{p}.mlp.experts.down_proj"),
                            experts.count,
                            d,
                            c.intermediate,
                        )?,
                        top_k: experts.top_k,
                    },
                })
            })
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        Ok(GptOss {
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
        for (li, l) in self.layers.iter().enumerate() {
            rms_norm(&s.x, &l.input_norm, c.rms_eps, &mut s.h);
            let window = if l.sliding { c.sliding_window } else { usize::MAX };
            let shape = attention_shape(c, Some(&l.sinks));
            l.attn.forward((&mut *pool, tables), li, batch, &self.rope, window, &shape, s, |_, _| {});
            add(&mut s.x, &s.o);
            rms_norm(&s.x, &l.post_norm, c.rms_eps, &mut s.h);
            l.moe.forward(&s.h, n, &mut s.o, &mut s.gate);
            add(&mut s.x, &s.o);
        }
        let norm = |x: &[f32], out: &mut Vec<f32>| rms_norm(x, &self.ends.norm, c.rms_eps, out);
        finish(batch, d, s, output, norm, self.ends.head())
    }
}
