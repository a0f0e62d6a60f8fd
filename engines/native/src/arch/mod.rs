//! One file per architecture family; what they share (the batch they run, the scratch buffers)
//! is here.

pub mod gemma3;
pub mod llama;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{Arch, ModelConfig};
use crate::kernels::linear::Linear;
use crate::kv_cache::{BlockTable, KvPool};

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
