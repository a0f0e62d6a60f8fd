//! The staged KV cache's quality cost, measured (issue 13; `bench/src/kv_eval.rs` is the tool,
//! a test uses it too): a text teacher-forced through one model twice in lockstep, once over an
//! f16 cache and once over a cache run by a KV policy, applied after every step by the same
//! pass the scheduler runs (`kv_control.rs`). Text is fed in steps, as a policy acting between
//! serving steps sees it; every position after the first recent window is scored.

use crate::arch::{BatchToken, ForwardError, Model, Scratch};
use crate::kv_cache::{BlockTable, KvPool, Level, Shape, BLOCK_TOKENS};
use crate::kv_control::{self, SeqView};
use llmr_kv_policy::KvPolicy;
use llmr_sampling::argmax;
use std::collections::HashSet;

pub struct EvalOptions {
    /// Tokens fed per step.
    pub step: usize,
    pub policy: KvPolicy,
    /// The policy run's KV budget in bytes (`None`: the f16 size of the whole text); the
    /// pressure the policy sees is the share of it in use.
    pub budget: Option<usize>,
    /// The share of the changeable blocks then evicted, those that received the least
    /// attention first (0: none), beyond what the policy does.
    pub evict: f64,
    /// The tokenizer's control tokens (the policy's semantic term).
    pub control_ids: HashSet<u32>,
    /// Keep the f16 copies of blocks stored lower (`KvPool::enable_spill`), as serving does by
    /// default: the policy promotes blocks back.
    pub copies: bool,
    /// With copies, recall evicted blocks a query could weigh at this share (`kv_recall.rs`).
    pub recall: Option<f32>,
}

#[derive(Debug)]
pub struct EvalReport {
    pub scored: usize,
    pub ppl_f16: f64,
    pub ppl: f64,
    /// KL divergence of the policy run's next-token distribution from the f16 run's.
    pub kld_mean: f64,
    pub kld_p999: f64,
    pub top1_agreement: f64,
    /// Measured from the pools' storage at the end.
    pub kv_bytes_f16: usize,
    pub kv_bytes: usize,
    /// (block, layer) pairs per level at the end, indexed by `Level as usize`.
    pub levels: [usize; 4],
    pub seconds_f16: f64,
    pub seconds: f64,
    /// Time in the policy's passes, and how many there were.
    pub policy_seconds: f64,
    pub passes: usize,
    /// (block, layer, KV head) reads of evicted blocks recall made.
    pub recalls: u64,
    /// Blocks the policy's passes stored higher again from their f16 copies.
    pub promoted: usize,
}

impl EvalReport {
    pub fn delta_ppl_rel(&self) -> f64 {
        self.ppl / self.ppl_f16 - 1.0
    }
}

/// One cache and its sequence.
pub(crate) struct Run {
    pub pool: KvPool,
    pub table: BlockTable,
    scratch: Scratch,
    pub seconds: f64,
    /// Blocks the policy's passes stored higher again from their f16 copies.
    pub promoted: usize,
}

impl Run {
    /// An empty sequence over a pool of `blocks` blocks, an f16 one.
    pub fn new(shape: Shape, blocks: usize) -> Run {
        let pool = KvPool::new(shape, blocks);
        Run { pool, table: BlockTable::default(), scratch: Scratch::default(), seconds: 0.0, promoted: 0 }
    }

    /// An empty sequence over a pool of `blocks` blocks run by `o`'s policy: within its
    /// budget, with its copies and recall, recording attention where the policy reads it.
    pub fn with_policy(shape: Shape, blocks: usize, o: &EvalOptions) -> Result<Run, ForwardError> {
        let mut run = Run::new(shape, blocks);
        if let Some(bytes) = o.budget {
            run.pool = run.pool.with_budget(bytes);
        }
        if o.copies || o.recall.is_some() {
            run.pool.enable_spill().map_err(|e| ForwardError(format!("the spill file: {e}")))?;
        }
        if let Some(share) = o.recall {
            run.pool.enable_recall(share);
        }
        run.pool.track_attention(o.evict > 0.0 || o.policy.needs_attention());
        Ok(run)
    }

    /// Runs `tokens` at positions from `start`, room for them reserved already; the logits of
    /// every one of them, or with `last_only` of the last.
    pub fn step(
        &mut self,
        model: &Model,
        tokens: &[u32],
        start: usize,
        last_only: bool,
    ) -> Result<Vec<f32>, ForwardError> {
        let n = tokens.len();
        self.table.len += n;
        let batch: Vec<BatchToken> = (0..n)
            .map(|i| BatchToken { token: tokens[i], seq: 0, pos: start + i, logits: !last_only || i + 1 == n })
            .collect();
        let t = std::time::Instant::now();
        let logits = model.forward(&mut self.pool, &[&self.table], &batch, &mut self.scratch)?;
        self.seconds += t.elapsed().as_secs_f64();
        Ok(logits)
    }

    /// Room for `n` more tokens of the sequence `seen` begins. Where the budget has none, the
    /// policy's pass makes it with what the step needs (the scheduler's fast loop), once.
    pub fn reserve_under(&mut self, o: &EvalOptions, seen: &[u32], n: usize, ctx: usize) -> Result<(), ForwardError> {
        if self.pool.reserve(&mut self.table, n).is_ok() {
            return Ok(());
        }
        let missing = (self.table.len + n).div_ceil(BLOCK_TOKENS) - self.table.blocks.len();
        let need = missing * self.pool.shape().block_bytes();
        let seq = SeqView { table: &self.table, tokens: seen };
        self.promoted +=
            kv_control::apply(&o.policy, &mut self.pool, &[seq], ctx, &|t| o.control_ids.contains(&t), need).promoted;
        self.pool.reserve(&mut self.table, n).map_err(|_| {
            ForwardError(format!(
                "at position {} the policy keeps {} bytes of a {}-byte budget: no room for the next step",
                seen.len(),
                self.pool.held_bytes(),
                self.pool.budget()
            ))
        })
    }

    /// The policy's pass between steps (the mid loop), then the least attended blocks evicted
    /// up to `o.evict` of those it may change. Returns the pass's seconds.
    pub fn policy_pass(&mut self, o: &EvalOptions, seen: &[u32], ctx: usize) -> f64 {
        let t = std::time::Instant::now();
        let seq = SeqView { table: &self.table, tokens: seen };
        self.promoted +=
            kv_control::apply(&o.policy, &mut self.pool, &[seq], ctx, &|t| o.control_ids.contains(&t), 0).promoted;
        let seconds = t.elapsed().as_secs_f64();
        let changeable = o.policy.changeable(self.table.len, BLOCK_TOKENS);
        evict_least_attended(self, changeable, o.evict);
        seconds
    }
}

/// Evicts blocks `range` of `run`'s sequence, least attention received first, until `share` of
/// them are evicted.
fn evict_least_attended(run: &mut Run, range: std::ops::Range<usize>, share: f64) {
    let target = (range.len() as f64 * share).floor() as usize;
    let evicted = |run: &Run, i: usize| run.pool.level(&run.table, i) == Level::Evicted;
    let done = range.clone().filter(|&i| evicted(run, i)).count();
    if done >= target {
        return;
    }
    let mut kept: Vec<(f64, usize)> = range
        .filter(|&i| !evicted(run, i))
        .map(|i| (run.pool.attention_received(run.table.blocks[i]).unwrap_or(0.0), i))
        .collect();
    kept.sort_by(|a, b| a.0.total_cmp(&b.0));
    for &(_, i) in kept.iter().take(target - done) {
        run.pool.evict(&run.table, i);
    }
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
    row.iter().map(|&x| x as f64 - log_sum).collect()
}

/// Runs `tokens` through `model` (cache geometry `shape`, `vocab` logits a position) both ways.
pub fn evaluate(
    model: &Model,
    shape: Shape,
    vocab: usize,
    tokens: &[u32],
    o: &EvalOptions,
) -> Result<EvalReport, ForwardError> {
    let window = o.policy.recent_window;
    assert!(o.step > 0 && tokens.len() > window + 1);
    let blocks = tokens.len().div_ceil(BLOCK_TOKENS);
    let (mut base, mut test) = (Run::new(shape, blocks), Run::with_policy(shape, blocks, o)?);
    let (mut policy_seconds, mut passes) = (0.0, 0);
    let (mut nll_base, mut nll_test, mut agree) = (0f64, 0f64, 0usize);
    let mut klds = Vec::new();
    for start in (0..tokens.len()).step_by(o.step) {
        let end = (start + o.step).min(tokens.len());
        base.pool.reserve(&mut base.table, end - start).map_err(|e| ForwardError(e.to_string()))?;
        test.reserve_under(o, &tokens[..start], end - start, tokens.len())?;
        let lb = base.step(model, &tokens[start..end], start, false)?;
        let lt = test.step(model, &tokens[start..end], start, false)?;
        for p in start.max(window)..end.min(tokens.len() - 1) {
            let (row_b, row_t) = (&lb[(p - start) * vocab..][..vocab], &lt[(p - start) * vocab..][..vocab]);
            let (rb, rt) = (log_softmax(row_b), log_softmax(row_t));
            let next = tokens[p + 1] as usize;
            nll_base -= rb[next];
            nll_test -= rt[next];
            klds.push(rb.iter().zip(&rt).map(|(b, t)| b.exp() * (b - t)).sum::<f64>().max(0.0));
            agree += (argmax(row_b) == argmax(row_t)) as usize;
        }
        policy_seconds += test.policy_pass(o, &tokens[..end], tokens.len());
        passes += 1;
    }
    let n = klds.len() as f64;
    let kld_mean = klds.iter().sum::<f64>() / n;
    klds.sort_by(f64::total_cmp);
    Ok(EvalReport {
        scored: klds.len(),
        ppl_f16: (nll_base / n).exp(),
        ppl: (nll_test / n).exp(),
        kld_mean,
        kld_p999: klds[((n * 0.999) as usize).min(klds.len() - 1)],
        top1_agreement: agree as f64 / n,
        kv_bytes_f16: base.pool.stored_bytes(),
        kv_bytes: test.pool.stored_bytes(),
        levels: test.pool.level_counts(),
        seconds_f16: base.seconds,
        seconds: test.seconds,
        policy_seconds,
        passes,
        recalls: test.pool.recalls(),
        promoted: test.promoted,
    })
}
