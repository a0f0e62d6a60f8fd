//! One file per architecture family; what they share (the batch they run, the scratch buffers)
//! is here.

pub mod gemma3;
pub mod llama;

use crate::attention::QueryPos;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{Arch, ModelConfig};
use crate::kernels::linear::Linear;
use crate::kv_cache::{BlockTable, KvPool};
use crate::rope::Rope;

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
}

/// The projection `{name}.weight` (`[rows, cols]`), with `{name}.bias` when `bias`.
pub(crate) fn linear(
    ck: &Checkpoint,
    name: &str,
    rows: usize,
    cols: usize,
    bias: bool,
) -> Result<Linear, CheckpointError> {
    let w = ck.get(&format!("{name}.weight"), &[rows, cols])?;
    let b = if bias { Some(ck.get(&format!("{name}.bias"), &[rows])?.to_f32()) } else { None };
    Ok(Linear::new(w, b))
}

/// The embedding rows of the batch's tokens into `x` (`tokens x d`).
pub(crate) fn embed_tokens(embed: &Linear, batch: &[BatchToken], d: usize, x: &mut Vec<f32>) {
    x.clear();
    x.resize(batch.len() * d, 0.0);
    for (t, b) in batch.iter().enumerate() {
        embed.row(b.token as usize, &mut x[t * d..(t + 1) * d]);
    }
}

/// Rotates each token's query and key heads for its position, then stores its key and value in
/// its sequence's blocks of `layer`.
pub(crate) fn rotate_and_store(
    rope: &Rope,
    (pool, tables): (&mut KvPool, &[&BlockTable]),
    layer: usize,
    batch: &[BatchToken],
    head_dim: usize,
    s: &mut Scratch,
) {
    let (qw, kw) = (s.q.len() / batch.len(), s.k.len() / batch.len());
    for (t, b) in batch.iter().enumerate() {
        rope.apply(&mut s.q[t * qw..(t + 1) * qw], head_dim, b.pos);
        rope.apply(&mut s.k[t * kw..(t + 1) * kw], head_dim, b.pos);
        pool.write(tables[b.seq], layer, b.pos, &s.k[t * kw..(t + 1) * kw], &s.v[t * kw..(t + 1) * kw]);
    }
}

/// Where each token of the batch attends: its sequence's positions from `pos + 1 - window` (0
/// when the window is unbounded) to `pos`.
pub(crate) fn queries<'a>(batch: &[BatchToken], tables: &[&'a BlockTable], window: usize) -> Vec<QueryPos<'a>> {
    batch
        .iter()
        .map(|b| QueryPos { table: tables[b.seq], pos: b.pos, first: (b.pos + 1).saturating_sub(window) })
        .collect()
}

/// Copies the hidden states of the tokens whose logits are wanted into `s.last`; returns how
/// many there are. Only they go through the final norm and the vocabulary projection.
pub(crate) fn logit_rows(batch: &[BatchToken], d: usize, s: &mut Scratch) -> usize {
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

/// A loaded model of any supported architecture.
pub enum Model {
    Llama(llama::Llama),
    Gemma3(gemma3::Gemma3),
}

impl Model {
    pub fn load(config: &ModelConfig, checkpoint: &Checkpoint) -> Result<Self, CheckpointError> {
        match config.arch {
            Arch::Llama | Arch::Qwen2 => Ok(Model::Llama(llama::Llama::load(config, checkpoint)?)),
            Arch::Gemma3 => Ok(Model::Gemma3(gemma3::Gemma3::load(config, checkpoint)?)),
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
    ) -> Vec<f32> {
        match self {
            Model::Llama(m) => m.forward(pool, tables, batch, s),
            Model::Gemma3(m) => m.forward(pool, tables, batch, s),
        }
    }
}
