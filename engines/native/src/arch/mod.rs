//! One file per architecture family; what they share (the batch they run, the scratch buffers)
//! is here.

pub mod gemma3;
pub mod gpt_oss;
pub mod llama;

use crate::attention::{attend, AttentionShape, QueryPos};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{Arch, ModelConfig};
use crate::kernels::linear::{forward_many, Linear};
use crate::kv_cache::{BlockTable, KvPool};
use crate::rope::Rope;
use llmr_sampling::DevicePick;
use rayon::prelude::*;

/// One token of a step's batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchToken {
    pub token: u32,
    /// Index into the step's block tables.
    pub seq: usize,
    pub pos: usize,
    /// Whether the step returns this token's logits.
    pub logits: bool,
}

/// What a forward pass returns for the tokens of the batch marked `logits`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Their vocabulary logits (`tokens x vocab`).
    Logits,
    /// Their hidden states after the final norm (`tokens x hidden`): what embeddings pool.
    Hidden,
}

/// Buffers a forward pass reuses from step to step.
#[derive(Default)]
pub struct Scratch {
    pub x: Vec<f32>,
    pub h: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub attn: Vec<f32>,
    pub o: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub last: Vec<f32>,
    /// The logits' storage: a step returns it, and the scheduler hands it back after sampling,
    /// so that a large vocabulary's rows (1 MiB a row on Gemma 3) are not fresh pages to fault
    /// in and zero every step.
    pub logits: Vec<f32>,
}

/// The projection `{name}.weight` (`[rows, cols]`), with `{name}.bias` when `bias`, multiplying
/// as `c` says.
pub(crate) fn linear(
    ck: &Checkpoint,
    c: &ModelConfig,
    name: &str,
    rows: usize,
    cols: usize,
    bias: bool,
) -> Result<Linear, CheckpointError> {
    let w = ck.get(&format!("{name}.weight"), &[rows, cols])?;
    let b = if bias { Some(ck.get(&format!("{name}.bias"), &[rows])?.to_f32()) } else { None };
    Ok(Linear::new(w, b, c.bf16_products, c.amx_products))
}

/// The embedding rows of the batch's tokens into `x` (`tokens x d`).
pub(crate) fn embed_tokens(embed: &Linear, batch: &[BatchToken], d: usize, x: &mut Vec<f32>) {
    x.clear();
    x.resize(batch.len() * d, 0.0);
    for (t, b) in batch.iter().enumerate() {
        embed.row(b.token as usize, &mut x[t * d..(t + 1) * d]);
    }
}

/// What every architecture has around its layers: the embedding table, the output head (the
/// embeddings again when config.json ties them: no `lm_head.weight` in the file) and the final
/// norm's weights.
pub(crate) struct Ends {
    pub embed: Linear,
    lm_head: Option<Linear>,
    pub norm: Vec<f32>,
}

impl Ends {
    pub(crate) fn load(ck: &Checkpoint, c: &ModelConfig) -> Result<Self, CheckpointError> {
        let lm_head = if c.tie_embeddings { None } else { Some(linear(ck, c, "lm_head", c.vocab, c.hidden, false)?) };
        Ok(Ends {
            embed: linear(ck, c, "model.embed_tokens", c.vocab, c.hidden, false)?,
            lm_head,
            norm: vector(ck, "model.norm.weight", c.hidden)?,
        })
    }

    /// The vocabulary projection.
    pub(crate) fn head(&self) -> &Linear {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

/// A layer's attention projections (`{prefix}.q_proj` .. `o_proj`, biased as the config says).
pub(crate) struct AttentionWeights {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
}

/// The geometry of `c`'s attention, with gpt-oss's per-head `sinks` when given.
pub(crate) fn attention_shape<'a>(c: &ModelConfig, sinks: Option<&'a [f32]>) -> AttentionShape<'a> {
    AttentionShape { heads: c.heads, kv_heads: c.kv_heads, head_dim: c.head_dim, scale: c.attention_scale, sinks }
}

impl AttentionWeights {
    pub(crate) fn load(ck: &Checkpoint, c: &ModelConfig, prefix: &str) -> Result<Self, CheckpointError> {
        let (d, q, kv) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        Ok(AttentionWeights {
            q: linear(ck, c, &format!("{prefix}.q_proj"), q, d, c.qkv_bias)?,
            k: linear(ck, c, &format!("{prefix}.k_proj"), kv, d, c.qkv_bias)?,
            v: linear(ck, c, &format!("{prefix}.v_proj"), kv, d, c.qkv_bias)?,
            o: linear(ck, c, &format!("{prefix}.o_proj"), d, q, c.o_bias)?,
        })
    }

    /// From the normed input `s.h` to the attention's output projection in `s.o`: q, k and v;
    /// `qk` on q and k (Gemma's per-head norms); the rotation; the batch's keys and values
    /// stored in `layer`; attention over the last `window` positions of each query (`usize::MAX`:
    /// all); the output projection.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        (pool, tables): (&mut KvPool, &[&BlockTable]),
        layer: usize,
        batch: &[BatchToken],
        rope: &Rope,
        window: usize,
        shape: &AttentionShape<'_>,
        s: &mut Scratch,
        qk: impl FnOnce(&mut [f32], &mut [f32]),
    ) {
        let n = batch.len();
        forward_many(&mut [(&self.q, &mut s.q), (&self.k, &mut s.k), (&self.v, &mut s.v)], &s.h, n);
        qk(&mut s.q, &mut s.k);
        rotate_and_store(rope, (&mut *pool, tables), layer, batch, shape.head_dim, s);
        let queries = queries(batch, tables, window);
        // `attend` writes every output.
        s.attn.resize(n * shape.heads * shape.head_dim, 0.0);
        attend(pool, layer, shape, &queries, &s.q, &mut s.attn, self.q.prompt_products(n));
        self.o.forward(&s.attn, n, &mut s.o);
    }
}

/// The rows of `s.x` whose output the batch wants, through the final `norm`: their hidden
/// states, or their logits by `head`.
pub(crate) fn finish(
    batch: &[BatchToken],
    d: usize,
    s: &mut Scratch,
    output: Output,
    norm: impl FnOnce(&[f32], &mut Vec<f32>),
    head: &Linear,
) -> Vec<f32> {
    let rows = logit_rows(batch, d, s);
    norm(&s.last, &mut s.h);
    if output == Output::Hidden {
        return std::mem::take(&mut s.h);
    }
    let mut logits = std::mem::take(&mut s.logits);
    head.forward(&s.h, rows, &mut logits);
    logits
}

/// Rotates each token's query and key heads for its position, then stores its key and value in
/// its sequence's blocks of `layer`.
fn rotate_and_store(
    rope: &Rope,
    (pool, tables): (&mut KvPool, &[&BlockTable]),
    layer: usize,
    batch: &[BatchToken],
    head_dim: usize,
    s: &mut Scratch,
) {
    let (qw, kw) = (s.q.len() / batch.len(), s.k.len() / batch.len());
    // The tokens spread over the pool (a prompt chunk's rotations on one thread kept the
    // others waiting); a decoding step's few stay on the caller's thread.
    let rotate = |((q, k), b): ((&mut [f32], &mut [f32]), &BatchToken)| rope.apply_all(&mut [q, k], head_dim, b.pos);
    let tokens = s.q.par_chunks_exact_mut(qw).zip(s.k.par_chunks_exact_mut(kw)).zip(batch);
    tokens.with_min_len(ROTATE_TASK_TOKENS).for_each(rotate);
    for (t, b) in batch.iter().enumerate() {
        pool.write(tables[b.seq], layer, b.pos, &s.k[t * kw..(t + 1) * kw], &s.v[t * kw..(t + 1) * kw]);
    }
}

/// Tokens one rotation task takes.
const ROTATE_TASK_TOKENS: usize = 16;

/// Where each token of the batch attends: its sequence's positions from `pos + 1 - window` (0
/// when the window is unbounded) to `pos`.
fn queries<'a>(batch: &[BatchToken], tables: &[&'a BlockTable], window: usize) -> Vec<QueryPos<'a>> {
    batch
        .iter()
        .map(|b| QueryPos { table: tables[b.seq], pos: b.pos, first: (b.pos + 1).saturating_sub(window) })
        .collect()
}

/// Copies the hidden states of the tokens whose logits are wanted into `s.last`; returns how
/// many there are. Only they go through the final norm and the vocabulary projection.
fn logit_rows(batch: &[BatchToken], d: usize, s: &mut Scratch) -> usize {
    s.last.clear();
    for (t, b) in batch.iter().enumerate() {
        if b.logits {
            s.last.extend_from_slice(&s.x[t * d..(t + 1) * d]);
        }
    }
    s.last.len() / d
}

/// A 1-D tensor (norm weights) as f32.
pub(crate) fn vector(ck: &Checkpoint, name: &str, len: usize) -> Result<Vec<f32>, CheckpointError> {
    Ok(ck.get(name, &[len])?.to_f32())
}

/// A loaded model of any supported architecture, on the CPU or (feature `cuda`) on a GPU.
pub enum Model {
    Llama(llama::Llama),
    Gemma3(gemma3::Gemma3),
    GptOss(gpt_oss::GptOss),
    /// The dense architectures on a GPU: the host pool keeps the block tables, the device
    /// keeps the blocks' keys and values.
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::cuda::CudaModel>),
}

/// One output row of [`Model::pick`].
#[derive(Clone, Debug, PartialEq)]
pub enum Picked {
    Id(u32),
    Logits(Vec<f32>),
}

/// A forward pass that failed: only a GPU's can (a device error, memory); the CPU's cannot.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ForwardError(pub String);

impl Model {
    pub fn load(config: &ModelConfig, checkpoint: &Checkpoint) -> Result<Self, CheckpointError> {
        match config.arch {
            Arch::Llama | Arch::Qwen2 => Ok(Model::Llama(llama::Llama::load(config, checkpoint)?)),
            Arch::Gemma3 => Ok(Model::Gemma3(gemma3::Gemma3::load(config, checkpoint)?)),
            Arch::GptOss => Ok(Model::GptOss(gpt_oss::GptOss::load(config, checkpoint)?)),
        }
    }

    /// Runs `batch` (its keys and values are written into `tables`' blocks, which must have room)
    /// and returns the logits of the tokens that asked for them, in batch order.
    pub fn forward(
        &self,
        pool: &mut KvPool,
        tables: &[&BlockTable],
        batch: &[BatchToken],
        s: &mut Scratch,
    ) -> Result<Vec<f32>, ForwardError> {
        self.run(pool, tables, batch, s, Output::Logits)
    }

    /// Whether this model picks ids where its logits are ([`Model::pick`]): a GPU model, and
    /// then whether it also draws (temperature sampling), not only takes the most likely.
    /// Asked before a step, because a pick that draws takes its request's next random number.
    pub fn picks_on_device(&self) -> Option<bool> {
        #[cfg(feature = "cuda")]
        if let Model::Cuda(m) = self {
            return Some(m.draws());
        }
        None
    }

    /// As [`Model::forward`], but each token that asked for logits gets its id picked where the
    /// logits are, as `picks` (one per such token, in batch order) says, so that the host reads
    /// 4 bytes a row rather than the vocabulary's logits; a token without a pick gets its logits.
    /// `None` where the model does not pick ([`Model::picks_on_device`]: the CPU models).
    pub fn pick(
        &self,
        tables: &[&BlockTable],
        batch: &[BatchToken],
        picks: &[Option<DevicePick>],
    ) -> Option<Result<Vec<Picked>, ForwardError>> {
        #[cfg(feature = "cuda")]
        if let Model::Cuda(m) = self {
            return Some(m.pick(tables, batch, picks).map_err(|e| ForwardError(e.to_string())));
        }
        let _ = (tables, batch, picks);
        None
    }

    /// As [`Model::forward`], returning final hidden states in place of logits.
    pub fn hidden(
        &self,
        pool: &mut KvPool,
        tables: &[&BlockTable],
        batch: &[BatchToken],
        s: &mut Scratch,
    ) -> Result<Vec<f32>, ForwardError> {
        self.run(pool, tables, batch, s, Output::Hidden)
    }

    fn run(
        &self,
        pool: &mut KvPool,
        tables: &[&BlockTable],
        batch: &[BatchToken],
        s: &mut Scratch,
        output: Output,
    ) -> Result<Vec<f32>, ForwardError> {
        Ok(match self {
            Model::Llama(m) => m.forward(pool, tables, batch, s, output),
            Model::Gemma3(m) => m.forward(pool, tables, batch, s, output),
            Model::GptOss(m) => m.forward(pool, tables, batch, s, output),
            #[cfg(feature = "cuda")]
            Model::Cuda(m) => m.forward(tables, batch, output).map_err(|e| ForwardError(e.to_string()))?,
        })
    }
}
