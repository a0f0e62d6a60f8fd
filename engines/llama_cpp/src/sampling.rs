//! Token selection. Where the logits alone decide (greedy without penalties: argmax; temperature
//! without top-k or penalties, with or without top-p and min-p), the shared `llmr_sampling::Direct`
//! samplers read them straight, as every engine does; everything else goes through a llama.cpp
//! sampler chain in llama-server's order. A constrained request copies its logits, masks them
//! with its grammar (`llmr_constraint`) and draws with the shared sampler: llama.cpp's chain reads
//! the context's logits and cannot take masked ones from outside.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llmr_constraint::{ConstrainedSampler, TokenMask};
use llmr_engine_sdk::Sampling;
use llmr_sampling::{is_greedy, random_seed, Direct, PENALTY_LAST_N};
use std::time::Duration;

pub enum TokenSampler {
    Direct(Direct),
    Chain(LlamaSampler),
    Masked(Box<Masked>),
}

/// A constrained request's draws, and the recent tokens its penalties read.
pub struct Masked {
    draws: ConstrainedSampler,
    history: Vec<u32>,
}

impl TokenSampler {
    pub fn new(p: &Sampling, n_vocab: i32, mask: Option<TokenMask>) -> Self {
        if let Some(mask) = mask {
            let draws = ConstrainedSampler::new(mask, p, n_vocab.max(0) as usize);
            return Self::Masked(Box::new(Masked { draws, history: Vec::new() }));
        }
        if let Some(direct) = Direct::for_settings(p) {
            return Self::Direct(direct);
        }
        let mut chain = Vec::new();
        if p.has_penalties() {
            chain.push(LlamaSampler::penalties(
                n_vocab,
                PENALTY_LAST_N as i32,
                p.repeat_penalty,
                p.frequency_penalty,
                p.presence_penalty,
            ));
        }
        if is_greedy(p) {
            chain.push(LlamaSampler::greedy());
            return Self::Chain(LlamaSampler::chain_simple(chain));
        }
        if let Some(k) = p.top_k {
            chain.push(LlamaSampler::top_k(k.min(i32::MAX as u32) as i32));
        }
        if p.top_p < 1.0 {
            chain.push(LlamaSampler::top_p(p.top_p, 1));
        }
        if p.min_p > 0.0 {
            chain.push(LlamaSampler::min_p(p.min_p, 1));
        }
        chain.push(LlamaSampler::temp(p.temperature));
        let seed = p.seed.map_or_else(random_seed, |s| (s ^ (s >> 32)) as u32);
        chain.push(LlamaSampler::dist(seed));
        Self::Chain(LlamaSampler::chain_simple(chain))
    }

    /// For a constrained request, the time its mask took since the last call.
    pub fn take_mask_time(&mut self) -> Option<Duration> {
        match self {
            Self::Masked(m) => Some(m.draws.take_mask_time()),
            _ => None,
        }
    }

    /// Picks the next token from output `idx` of the last decode; `history` is the sequence so
    /// far (the penalties of a masked draw read it). Chains record the token themselves
    /// (llama.cpp's sample = apply + accept), which is what their penalties need. An error is the
    /// grammar engine's.
    pub fn sample(&mut self, ctx: &LlamaContext<'_>, idx: i32, history: &[LlamaToken]) -> Result<LlamaToken, String> {
        match self {
            Self::Direct(d) => Ok(LlamaToken(d.sample(ctx.get_logits_ith(idx)) as i32)),
            Self::Chain(s) => Ok(s.sample(ctx, idx)),
            Self::Masked(m) => {
                let recent = &history[history.len().saturating_sub(PENALTY_LAST_N)..];
                m.history.clear();
                m.history.extend(recent.iter().map(|t| t.0 as u32));
                Ok(LlamaToken(m.draws.sample(ctx.get_logits_ith(idx), &m.history)? as i32))
            }
        }
    }
}
