//! Whether a KV policy keeps what a task needs from far back (issue 13; `bench/src/kv_eval.rs`
//! `--passkey` builds the prompts and checks the answers): each prompt is read in steps over an
//! f16 cache and over one run by the policy, with the policy's pass after every step as in
//! [`crate::kv_eval`], then each run answers greedily, a token a step, the policy still acting.
//! Perplexity averages over every position; a fact said once and asked for at the end is what
//! eviction can lose while perplexity hardly moves.

use crate::arch::{ForwardError, Model};
use crate::kv_cache::{Shape, BLOCK_TOKENS};
use crate::kv_eval::{EvalOptions, Run};
use crate::tokenizer::ModelTokenizer;
use llmr_sampling::argmax;

/// Greedy tokens a pass-key answer may take (a 5-digit key is 1-6 tokens with a space).
pub const ANSWER_TOKENS: usize = 8;

/// A pass-key prompt: its tokens, the key, and the depth of the sentence that says it.
pub struct Passkey {
    pub tokens: Vec<u32>,
    pub key: String,
    pub depth: f64,
}

/// `n` prompts of `ctx` tokens, [`ANSWER_TOKENS`] of them left for the answer: an instruction,
/// `text`'s tokens as filler (from a different place in it each time, past its first token),
/// the key's sentence at a depth from 5% to 95% of the filler, and the question. Keys are fixed
/// 5-digit numbers, a different one in each prompt.
pub fn passkey_prompts(tokenizer: &ModelTokenizer, text: &[u32], ctx: usize, n: usize) -> Result<Vec<Passkey>, String> {
    let enc = |s: &str, bos: bool| tokenizer.encode(s, bos, false);
    let intro = enc(
        "There is a pass key hidden in the text below. Find it and remember it: you will be asked for it.\n\n",
        true,
    )?;
    let question = enc("\n\nWhat is the pass key? The pass key is", false)?;
    (0..n)
        .map(|i| {
            let key = (10_000 + (i as u64 * 48_271 + 7_919) % 90_000).to_string();
            let needle = enc(&format!("\n\nThe pass key is {key}. Remember it: {key} is the pass key.\n\n"), false)?;
            let fixed = intro.len() + needle.len() + question.len() + ANSWER_TOKENS;
            let Some(filler_len) = ctx.checked_sub(fixed).filter(|&f| f >= 64 && text.len() > f + 1) else {
                return Err(format!("a context of {ctx} tokens leaves no room for filler, or the text is shorter"));
            };
            let from = 1 + (i * 7_919) % (text.len() - filler_len);
            let filler = &text[from..from + filler_len];
            let depth = if n > 1 { 0.05 + 0.9 * i as f64 / (n - 1) as f64 } else { 0.5 };
            let at = (filler_len as f64 * depth) as usize;
            let tokens = [&intro[..], &filler[..at], &needle, &filler[at..], &question].concat();
            Ok(Passkey { tokens, key, depth })
        })
        .collect()
}

/// What one prompt got.
#[derive(Debug)]
pub struct Answers {
    /// Greedy tokens after the prompt, over the f16 cache and over the policy's.
    pub f16: Vec<u32>,
    pub policy: Vec<u32>,
    /// Measured from the policy run's pool when it answered, and the f16 run's.
    pub kv_bytes: usize,
    pub kv_bytes_f16: usize,
    /// (block, layer) pairs per level then, indexed by `Level as usize`.
    pub levels: [usize; 4],
    /// (block, layer, KV head) reads of evicted blocks recall made.
    pub recalls: u64,
    /// Blocks the policy's passes stored higher again from their f16 copies.
    pub promoted: usize,
}

/// Reads `prompt` both ways and answers `answer_tokens` tokens greedily. `o.budget` is the
/// policy run's KV budget in bytes.
pub fn answer(
    model: &Model,
    shape: Shape,
    vocab: usize,
    prompt: &[u32],
    answer_tokens: usize,
    o: &EvalOptions,
) -> Result<Answers, ForwardError> {
    assert!(o.step > 0 && !prompt.is_empty() && answer_tokens > 0);
    let ctx = prompt.len() + answer_tokens;
    let blocks = ctx.div_ceil(BLOCK_TOKENS);
    let (mut base, mut test) = (Run::new(shape, blocks), Run::with_policy(shape, blocks, o)?);
    let mut seen = Vec::with_capacity(ctx);
    let (mut last_b, mut last_t) = (Vec::new(), Vec::new());
    for chunk in prompt.chunks(o.step) {
        let start = seen.len();
        base.pool.reserve(&mut base.table, chunk.len()).map_err(|e| ForwardError(e.to_string()))?;
        test.reserve_under(o, &seen, chunk.len(), ctx)?;
        last_b = base.step(model, chunk, start, true)?;
        last_t = test.step(model, chunk, start, true)?;
        seen.extend_from_slice(chunk);
        test.policy_pass(o, &seen, ctx);
    }
    // Each run continues its own answer; the policy run's sequence is its own tokens.
    let (mut f16, mut policy) = (Vec::new(), Vec::new());
    let mut seen_t = seen.clone();
    for _ in 0..answer_tokens {
        let (tb, tt) = (argmax(&last_b[..vocab]) as u32, argmax(&last_t[..vocab]) as u32);
        f16.push(tb);
        policy.push(tt);
        if f16.len() == answer_tokens {
            break;
        }
        let pos = seen.len() + f16.len() - 1;
        base.pool.reserve(&mut base.table, 1).map_err(|e| ForwardError(e.to_string()))?;
        test.reserve_under(o, &seen_t, 1, ctx)?;
        last_b = base.step(model, &[tb], pos, true)?;
        last_t = test.step(model, &[tt], pos, true)?;
        seen_t.push(tt);
        test.policy_pass(o, &seen_t, ctx);
    }
    Ok(Answers {
        f16,
        policy,
        kv_bytes: test.pool.stored_bytes(),
        kv_bytes_f16: base.pool.stored_bytes(),
        levels: test.pool.level_counts(),
        recalls: test.pool.recalls(),
        promoted: test.promoted,
    })
}
