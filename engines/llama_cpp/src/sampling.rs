//! Token selection. Where the logits alone decide (greedy without penalties: argmax; temperature
//! without top-k or penalties, with or without top-p and min-p), the shared `llmr_sampling::Direct`
//! samplers read them straight, as every engine does; everything else goes through a llama.cpp
//! sampler chain in llama-server's order.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llmr_engine_sdk::Sampling;
use llmr_sampling::{is_greedy, random_seed, Direct, PENALTY_LAST_N};

pub enum TokenSampler {
    Direct(Direct),
    Chain(LlamaSampler),
}

impl TokenSampler {
    pub fn new(p: &Sampling, n_vocab: i32) -> Self {
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

    /// Picks the next token from output `idx` of the last decode. Chains record the token
    /// themselves (llama.cpp's sample = apply + accept), which is what the penalties need.
    pub fn sample(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> LlamaToken {
        match self {
            Self::Direct(d) => LlamaToken(d.sample(ctx.get_logits_ith(idx)) as i32),
            Self::Chain(s) => s.sample(ctx, idx),
        }
    }
}
