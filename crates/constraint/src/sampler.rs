//! Drawing a token under a grammar: what every engine that samples from its own logits does
//! with a [`TokenMask`], in one place.

use crate::TokenMask;
use llmr_engine_types::Sampling;
use llmr_sampling::Sampler;
use std::time::{Duration, Instant};

/// One constrained request's draws: the mask, the request's sampler, the masked row.
pub struct ConstrainedSampler {
    mask: TokenMask,
    sampler: Sampler,
    masked: Vec<f32>,
    /// Time the mask took (computing, applying, following the drawn token) since
    /// [`take_mask_time`](Self::take_mask_time) last read it.
    spent: Duration,
}

impl ConstrainedSampler {
    pub fn new(mask: TokenMask, sampling: &Sampling, n_vocab: usize) -> Self {
        ConstrainedSampler { mask, sampler: Sampler::new(sampling, n_vocab), masked: Vec::new(), spent: Duration::ZERO }
    }

    /// Draws the next token from `logits` under the grammar (`history`: the sequence so far, for
    /// the penalties) and follows it. An error is the grammar engine's.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, String> {
        let started = Instant::now();
        self.mask.apply(logits, &mut self.masked)?;
        self.spent += started.elapsed();
        let token = self.sampler.sample(&self.masked, history);
        let started = Instant::now();
        self.mask.accept(token)?;
        self.spent += started.elapsed();
        Ok(token)
    }

    /// The mask's time since the last call.
    pub fn take_mask_time(&mut self) -> Duration {
        std::mem::take(&mut self.spent)
    }
}
