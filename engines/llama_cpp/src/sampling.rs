//! Token selection. Greedy decoding without penalties takes the argmax of the logits directly
//! (no candidate array over the whole vocabulary: that alone was seen to cost ~10% of decode
//! speed); temperature sampling without top-k or penalties, with or without top-p and min-p
//! (the OpenAI parameters), draws straight from the logits too (`temperature.rs`);
//! everything else goes through a llama.cpp sampler chain in llama-server's order.

use crate::temperature::TemperatureSampler;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llmr_engine_sdk::Sampling;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tokens the repetition penalties look back over (llama.cpp's default).
const PENALTY_LAST_N: i32 = 64;

pub enum TokenSampler {
    Argmax,
    Temperature(TemperatureSampler),
    Chain(LlamaSampler),
}

/// A fresh seed per unseeded request: distinct across requests, not reproducible by design.
fn random_seed() -> u32 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mixed =
        (nanos ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (mixed >> 32) as u32
}

impl TokenSampler {
    pub fn new(p: &Sampling, n_vocab: i32) -> Self {
        let greedy = p.temperature <= 0.0 || p.top_k == Some(1);
        if greedy && !p.has_penalties() {
            return Self::Argmax;
        }
        let mut chain = Vec::new();
        if p.has_penalties() {
            chain.push(LlamaSampler::penalties(
                n_vocab,
                PENALTY_LAST_N,
                p.repeat_penalty,
                p.frequency_penalty,
                p.presence_penalty,
            ));
        }
        if greedy {
            chain.push(LlamaSampler::greedy());
            return Self::Chain(LlamaSampler::chain_simple(chain));
        }
        if p.top_k.is_none() && !p.has_penalties() {
            let seed = p.seed.unwrap_or_else(|| u64::from(random_seed()));
            return Self::Temperature(TemperatureSampler::new(p.temperature, p.top_p, p.min_p, seed));
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
            Self::Argmax => LlamaToken(argmax(ctx.get_logits_ith(idx)) as i32),
            Self::Temperature(s) => LlamaToken(s.sample(ctx.get_logits_ith(idx)) as i32),
            Self::Chain(s) => s.sample(ctx, idx),
        }
    }
}

pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    let mut best_val = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_val {
            best_val = v;
            best = i;
        }
    }
    best
}

/// Log-probability of `chosen` and the `top_n` most likely tokens under the model's own
/// distribution (raw logits, before sampling transforms), as OpenAI reports them.
pub fn logprobs(logits: &[f32], chosen: usize, top_n: usize) -> (f32, Vec<(usize, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln() + max;
    let mut top: Vec<(usize, f32)> = Vec::with_capacity(top_n + 1);
    if top_n > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if top.len() < top_n || l > top[top.len() - 1].1 {
                let at = top.partition_point(|&(_, v)| v >= l);
                top.insert(at, (i, l));
                top.truncate(top_n);
            }
        }
    }
    let chosen_lp = logits.get(chosen).map_or(f32::NEG_INFINITY, |l| l - log_sum);
    (chosen_lp, top.into_iter().map(|(i, l)| (i, l - log_sum)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_and_logprobs_agree_with_a_direct_softmax() {
        let logits = [1.0f32, 3.0, 2.0, -1.0];
        assert_eq!(argmax(&logits), 1);
        let (lp, top) = logprobs(&logits, 2, 3);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((lp - (2.0f32.exp() / z).ln()).abs() < 1e-5);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 0]);
        let total: f32 = logits.iter().map(|&l| (l - z.ln()).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
}
