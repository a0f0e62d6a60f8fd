//! The staged KV cache's quality cost, measured (issue 13; `bench/src/kv_eval.rs` is the tool,
//! a test uses it too): a text teacher-forced through one model twice in lockstep, once over an
//! f16 cache and once over a cache whose full blocks outside the recent window go to a level
//! after every step (the first block, the attention sinks, stays f16). Text is fed in steps, as
//! a policy acting between serving steps sees it; every position after the first window is
//! scored.

use crate::arch::{BatchToken, ForwardError, Model, Scratch};
use crate::kv_cache::{BlockTable, KvPool, Level, Shape, BLOCK_TOKENS};
use llmr_sampling::argmax;

pub struct EvalOptions {
    /// Tokens fed per step.
    pub step: usize,
    /// The most recent positions kept in f16 (at least one block).
    pub window: usize,
    pub level: Level,
    /// The share of the blocks outside the window and the sinks to evict, those that received
    /// the least attention first (0: none).
    pub evict: f64,
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
}

impl EvalReport {
    pub fn delta_ppl_rel(&self) -> f64 {
        self.ppl / self.ppl_f16 - 1.0
    }
}

/// One cache and its sequence.
struct Run {
    pool: KvPool,
    table: BlockTable,
    scratch: Scratch,
    seconds: f64,
}

impl Run {
    fn step(&mut self, model: &Model, tokens: &[u32], start: usize) -> Result<Vec<f32>, ForwardError> {
        let n = tokens.len();
        self.pool.reserve(&mut self.table, n).map_err(|e| ForwardError(e.to_string()))?;
        self.table.len += n;
        let batch: Vec<BatchToken> =
            (0..n).map(|i| BatchToken { token: tokens[i], seq: 0, pos: start + i, logits: true }).collect();
        let t = std::time::Instant::now();
        let logits = model.forward(&mut self.pool, &[&self.table], &batch, &mut self.scratch)?;
        self.seconds += t.elapsed().as_secs_f64();
        Ok(logits)
    }
}

/// Evicts blocks `1..old` of `run`'s sequence, least attention received first, until `share` of
/// them are evicted.
fn evict_least_attended(run: &mut Run, old: usize, share: f64) {
    let candidates = old.saturating_sub(1);
    let target = (candidates as f64 * share).floor() as usize;
    let evicted = |run: &Run, i: usize| run.pool.layer(run.table.blocks[i], 0).level() == Level::Evicted;
    let done = (1..old).filter(|&i| evicted(run, i)).count();
    if done >= target {
        return;
    }
    let mut kept: Vec<(f64, usize)> =
        (1..old).filter(|&i| !evicted(run, i)).map(|i| (run.pool.attention_received(run.table.blocks[i]), i)).collect();
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
    assert!(o.window >= BLOCK_TOKENS && o.step > 0 && tokens.len() > o.window + 1);
    let blocks = tokens.len().div_ceil(BLOCK_TOKENS);
    let new_run = || Run {
        pool: KvPool::new(shape, blocks),
        table: BlockTable::default(),
        scratch: Scratch::default(),
        seconds: 0.0,
    };
    let (mut base, mut test) = (new_run(), new_run());
    test.pool.track_attention(o.evict > 0.0);
    let (mut nll_base, mut nll_test, mut agree) = (0f64, 0f64, 0usize);
    let mut klds = Vec::new();
    for start in (0..tokens.len()).step_by(o.step) {
        let end = (start + o.step).min(tokens.len());
        let lb = base.step(model, &tokens[start..end], start)?;
        let lt = test.step(model, &tokens[start..end], start)?;
        for p in start.max(o.window)..end.min(tokens.len() - 1) {
            let (row_b, row_t) = (&lb[(p - start) * vocab..][..vocab], &lt[(p - start) * vocab..][..vocab]);
            let (rb, rt) = (log_softmax(row_b), log_softmax(row_t));
            let next = tokens[p + 1] as usize;
            nll_base -= rb[next];
            nll_test -= rt[next];
            klds.push(rb.iter().zip(&rt).map(|(b, t)| b.exp() * (b - t)).sum::<f64>().max(0.0));
            agree += (argmax(row_b) == argmax(row_t)) as usize;
        }
        // The policy between steps: every full block older than the window, but the first, to
        // the level; then the least attended of them evicted up to the share asked.
        let old = test.table.len.saturating_sub(o.window) / BLOCK_TOKENS;
        for i in 1..old {
            test.pool.set_level(&test.table, i, None, o.level);
        }
        evict_least_attended(&mut test, old, o.evict);
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
    })
}
