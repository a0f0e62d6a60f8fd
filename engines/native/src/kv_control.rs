//! One pass of the KV policy over the running sequences (`kv_policy.rs` decides a block's
//! level; this finds the blocks, orders them and rewrites them). The scheduler runs it
//! between steps; the evaluator runs it between its steps too.
//!
//! Blocks are visited least important first and each decision reads the pressure as the pass
//! left it, so under a tight budget the pass stops demoting once the pool is back inside the
//! pressure band, and what it demotes is what matters least. When the next step needs room the
//! cache does not have (`need`), the pass goes on past the thresholds down to the policy's
//! emergency floor, least important first: int4 for every changeable block, then eviction,
//! until the step fits.
//!
//! Where the pool keeps f16 copies (`KvPool::enable_spill`), the pass first goes the other way,
//! most important first: a block stored lower than the policy now puts it (pressure fell, a
//! safer profile, a static level raised, the baseline after a failure) goes back up from its
//! copy, exactly. The policy is asked at the pressure the promotion would leave and for a
//! block `PROMOTE_MARGIN` less important than this one, so that a block whose importance or
//! pressure hovers at a threshold is not promoted and demoted pass after pass (each round trip
//! writes and reads its copy).

use crate::kv_cache::{BlockId, BlockTable, KvPool, Level, BLOCK_TOKENS};
use llmr_kv_policy::{BlockSignals, KvPolicy};
use std::collections::HashSet;

/// How much more important than a threshold a block must be to be promoted over it.
pub const PROMOTE_MARGIN: f64 = 0.1;

/// A running sequence as the pass sees it.
pub struct SeqView<'a> {
    pub table: &'a BlockTable,
    /// The tokens whose keys and values the table holds (at least `table.len` of them).
    pub tokens: &'a [u32],
}

#[derive(Debug, Default, Clone, Copy)]
pub struct PassReport {
    /// Blocks the policy could change.
    pub examined: usize,
    /// Blocks it stored lower.
    pub changed: usize,
    /// Blocks it stored higher again, from their f16 copies.
    pub promoted: usize,
    pub bytes_before: usize,
    pub bytes_after: usize,
}

/// Applies `policy` to the blocks of `seqs` (sequences of at most `ctx` positions);
/// `is_control` says which tokens are control tokens; `need`: bytes the next step must find.
pub fn apply(
    policy: &KvPolicy,
    pool: &mut KvPool,
    seqs: &[SeqView<'_>],
    ctx: usize,
    is_control: &dyn Fn(u32) -> bool,
    need: usize,
) -> PassReport {
    let mut report = PassReport { bytes_before: pool.held_bytes(), ..Default::default() };
    let promotable = pool.spilled() > 0;
    if !policy.is_active() && !promotable {
        report.bytes_after = report.bytes_before;
        return report;
    }
    // A block shared by several sequences is protected if it is in any one's sinks or window.
    let protected: HashSet<BlockId> = seqs
        .iter()
        .flat_map(|seq| {
            let changeable = policy.changeable(seq.table.len, BLOCK_TOKENS);
            let blocks = &seq.table.blocks;
            blocks[..changeable.start.min(blocks.len())].iter().chain(&blocks[changeable.end.min(blocks.len())..])
        })
        .copied()
        .collect();
    // (importance, sequence, block index), every changeable block not evicted yet.
    let mut candidates = Vec::new();
    for (s, seq) in seqs.iter().enumerate() {
        let len = seq.table.len;
        for i in policy.changeable(len, BLOCK_TOKENS) {
            let id = seq.table.blocks[i];
            let evicted = pool.level(seq.table, i) == Level::Evicted;
            if protected.contains(&id) || (evicted && !pool.restorable(seq.table, i)) {
                continue;
            }
            let signals = BlockSignals {
                attention: pool.attention_received(id),
                sharers: pool.sharers(id),
                control_token: seq.tokens[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS].iter().any(|&t| is_control(t)),
                start: i * BLOCK_TOKENS,
                end: (i + 1) * BLOCK_TOKENS,
            };
            candidates.push((policy.importance(&signals, len, ctx), s, i));
        }
    }
    report.examined = candidates.len();
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut promoted = HashSet::new();
    if promotable && need == 0 {
        // As if the block came back whole at f16: the most it can add.
        let whole = pool.shape().block_bytes();
        for &(importance, s, i) in candidates.iter().rev() {
            let table = seqs[s].table;
            let current = pool.level(table, i);
            if current == Level::F16 || !pool.restorable(table, i) {
                continue;
            }
            let level = policy.decide(importance - PROMOTE_MARGIN, pool.pressure_with(whole));
            if level < current && pool.promote(table, i, level) {
                // By block: a shared one is a candidate once per sequence holding it.
                promoted.insert(table.blocks[i]);
            }
        }
    }
    report.promoted = promoted.len();
    let mut changed = 0;
    let mut lower = |pool: &mut KvPool, s: usize, i: usize, level: Level| {
        let table = seqs[s].table;
        if level > pool.level(table, i) && !promoted.contains(&table.blocks[i]) {
            let done =
                if level == Level::Evicted { pool.evict(table, i) } else { pool.set_level(table, i, None, level) };
            changed += done as usize;
        }
    };
    for &(importance, s, i) in &candidates {
        lower(pool, s, i, policy.decide(importance, pool.pressure()));
    }
    if let Some(floor) = policy.emergency_floor() {
        for round in [Level::Int4, Level::Evicted].into_iter().filter(|&l| l <= floor) {
            for &(_, s, i) in &candidates {
                if pool.room_bytes() >= need {
                    break;
                }
                lower(pool, s, i, round);
            }
        }
    }
    report.changed = changed;
    report.bytes_after = pool.held_bytes();
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::Shape;
    use serde_json::json;

    fn pool_with(budget_blocks: usize, capacity: usize) -> KvPool {
        let shape = Shape { layers: 2, kv_heads: 1, head_dim: 64 };
        KvPool::new(shape, capacity).with_budget(budget_blocks * shape.block_bytes())
    }

    fn table(pool: &mut KvPool, len: usize) -> BlockTable {
        let mut t = BlockTable::default();
        pool.reserve(&mut t, len).unwrap();
        t.len = len;
        t
    }

    #[test]
    fn static_int8_stores_every_block_outside_the_window_and_sinks_and_frees_budget() {
        let mut pool = pool_with(10, 64);
        let t = table(&mut pool, 10 * BLOCK_TOKENS);
        assert!(pool.reserve(&mut BlockTable::default(), 1).is_err(), "the f16 budget is spent");
        let policy = KvPolicy::baseline().patched_json(&json!({"static_level": "int8"})).unwrap();
        let tokens = vec![1u32; t.len];
        let r = apply(&policy, &mut pool, &[SeqView { table: &t, tokens: &tokens }], 4096, &|_| false, 0);
        // Block 0 holds the sinks, the last four the 64-token window.
        assert_eq!((r.examined, r.changed), (5, 5));
        assert!(r.bytes_after < r.bytes_before);
        assert_eq!(pool.level(&t, 0), Level::F16);
        assert_eq!(pool.level(&t, 5), Level::Int8);
        assert_eq!(pool.level(&t, 6), Level::F16);
        assert_eq!(pool.stored_bytes(), r.bytes_after);
        assert!(pool.pressure() < 1.0);
        assert_eq!(pool.available(), 2, "five blocks at int8 freed more than two f16 blocks' bytes");
        // A second pass changes nothing.
        assert_eq!(
            apply(&policy, &mut pool, &[SeqView { table: &t, tokens: &tokens }], 4096, &|_| false, 0).changed,
            0
        );
    }

    #[test]
    fn dynamic_under_pressure_demotes_the_least_important_first_and_stops_below_the_band() {
        let mut pool = pool_with(16, 64);
        let t = table(&mut pool, 12 * BLOCK_TOKENS);
        let mut tokens = vec![1u32; t.len];
        tokens[3 * BLOCK_TOKENS + 2] = 7; // a control token in block 3
        let policy = KvPolicy::baseline().patched_json(&json!({"mode": "dynamic", "profile": "balanced"})).unwrap();
        assert_eq!(pool.pressure(), 0.75);
        let r = apply(&policy, &mut pool, &[SeqView { table: &t, tokens: &tokens }], 192, &|t| t == 7, 0);
        assert_eq!((r.examined, r.changed), (7, 7));
        // No attention recorded: importance falls with age. The oldest blocks went to int4
        // until pressure fell below the 0.6 band; the rest, and the control-token block, int8.
        let levels: Vec<Level> = (0..12).map(|i| pool.level(&t, i)).collect();
        use Level::*;
        assert_eq!(levels, [F16, Int4, Int4, Int8, Int4, Int4, Int8, Int8, F16, F16, F16, F16]);
        assert!(pool.pressure() < 0.6, "{}", pool.pressure());
    }

    #[test]
    fn a_raised_level_or_a_lower_pressure_brings_blocks_back_up_from_their_copies() {
        let shape = Shape { layers: 2, kv_heads: 1, head_dim: 64 };
        let mut pool = KvPool::new(shape, 64).with_budget(16 * shape.block_bytes());
        pool.enable_spill().unwrap();
        let t = table(&mut pool, 10 * BLOCK_TOKENS);
        let tokens = vec![1u32; t.len];
        let seqs = [SeqView { table: &t, tokens: &tokens }];
        let levels = |pool: &KvPool| (0..10).map(|i| pool.level(&t, i)).collect::<Vec<_>>();
        use Level::*;
        let at = |level: &str| KvPolicy::baseline().patched_json(&json!({ "static_level": level })).unwrap();
        let r = apply(&at("int4"), &mut pool, &seqs, 4096, &|_| false, 0);
        assert_eq!((r.changed, r.promoted), (5, 0));
        let r = apply(&at("int8"), &mut pool, &seqs, 4096, &|_| false, 0);
        assert_eq!((r.changed, r.promoted), (0, 5));
        assert_eq!(levels(&pool), [F16, Int8, Int8, Int8, Int8, Int8, F16, F16, F16, F16]);
        // The baseline (as after a failure in the policy path) brings every block back to f16.
        let r = apply(&KvPolicy::baseline(), &mut pool, &seqs, 4096, &|_| false, 0);
        assert_eq!((r.changed, r.promoted), (0, 5));
        assert_eq!((levels(&pool), pool.spilled()), ([F16; 10].to_vec(), 0));

        // Dynamic: under pressure the oldest blocks go to int4; once another sequence ends and
        // the pressure falls, they come back to what the policy gives them there (int8).
        let mut other = table(&mut pool, 4 * BLOCK_TOKENS);
        let dynamic = KvPolicy::baseline().patched_json(&json!({"mode": "dynamic", "profile": "balanced"})).unwrap();
        let pass = |pool: &mut KvPool, other: Option<&BlockTable>| {
            let other_tokens = vec![2u32; 4 * BLOCK_TOKENS];
            let mut seqs = vec![SeqView { table: &t, tokens: &tokens }];
            seqs.extend(other.map(|o| SeqView { table: o, tokens: &other_tokens }));
            apply(&dynamic, pool, &seqs, 192, &|_| false, 0)
        };
        assert!(pool.pressure() > 0.8);
        let r = pass(&mut pool, Some(&other));
        assert!(r.changed > 0 && r.promoted == 0);
        let int4 = levels(&pool).iter().filter(|&&l| l == Int4).count();
        assert!(int4 > 0, "{:?}", levels(&pool));
        pool.free_table(&mut other);
        let r = pass(&mut pool, None);
        assert_eq!(r.promoted, int4, "{:?}", levels(&pool));
        assert!(levels(&pool).iter().all(|&l| l <= Int8), "{:?}", levels(&pool));
        assert!(pool.pressure() < 0.6);
        assert_eq!(pool.held_bytes(), pool.stored_bytes());
    }

    #[test]
    fn an_evicted_block_read_back_for_a_later_question_is_promoted_and_one_never_read_back_stays_out() {
        let shape = Shape { layers: 2, kv_heads: 1, head_dim: 64 };
        let mut pool = KvPool::new(shape, 64).with_budget(12 * shape.block_bytes());
        pool.enable_spill().unwrap();
        pool.track_attention(true);
        let t = table(&mut pool, 12 * BLOCK_TOKENS);
        let tokens = vec![1u32; t.len];
        let seqs = [SeqView { table: &t, tokens: &tokens }];
        let policy = KvPolicy::baseline().patched_json(&json!({"mode": "dynamic", "profile": "balanced"})).unwrap();
        let pass = |pool: &mut KvPool| apply(&policy, pool, &seqs, 192, &|_| false, 0);
        // A block's 16 of 192 positions: a uniform row gives them 1/12 of its weight. Blocks 1
        // and 3..8 got 0.9 of every row's weight (they stay f16); block 2 a tenth of uniform
        // over a long history.
        let uniform = 1.0f64 / 12.0;
        for i in (1..8).filter(|&i| i != 2) {
            pool.note_attention(t.blocks[i], 900.0, 1000);
        }
        pool.note_attention(t.blocks[2], (1000.0 * 0.1 * uniform) as f32, 1000);
        assert!(pool.evict(&t, 2));
        let mean = pool.attention_received(t.blocks[2]).unwrap();
        assert!((mean - 0.1 * uniform).abs() < 1e-6, "eviction keeps the mean: {mean}");
        // Nothing read it back: it stays out, pass after pass, though the budget has room for
        // it at int8 (the pressure would be 1).
        for _ in 0..2 {
            let r = pass(&mut pool);
            assert_eq!((r.promoted, r.changed), (0, 0));
            assert_eq!(pool.level(&t, 2), Level::Evicted);
        }
        // A later question reads it back (recall, `attention.rs`): twenty rows giving it half
        // their weight. Over the whole history they would raise its mean to about a quarter
        // of uniform, still the least important; the history shrank to one row per (layer, KV
        // head) at eviction, so they lift it to 5.5x uniform and the pass brings it back.
        pool.note_attention(t.blocks[2], 10.0, 20);
        let lifetime = (1000.0 * 0.1 * uniform + 10.0) / 1020.0;
        assert!(lifetime < 0.25 * uniform);
        assert!(pool.attention_received(t.blocks[2]).unwrap() > 5.0 * uniform);
        let r = pass(&mut pool);
        assert_eq!(r.promoted, 1);
        assert_eq!(pool.level(&t, 2), Level::Int8, "importance 0.6 at pressure 1: int8");
        assert!(pool.held_bytes() <= pool.budget());
    }

    #[test]
    fn with_no_room_for_the_next_step_the_pass_goes_down_to_the_floor_least_important_first() {
        let run = |profile: &str| {
            let mut pool = pool_with(12, 64);
            let t = table(&mut pool, 12 * BLOCK_TOKENS);
            let tokens = vec![1u32; t.len];
            let policy = KvPolicy::baseline().patched_json(&json!({"mode": "dynamic", "profile": profile})).unwrap();
            // Six blocks: more than int4 on all seven changeable blocks frees.
            let need = 6 * pool.shape().block_bytes();
            apply(&policy, &mut pool, &[SeqView { table: &t, tokens: &tokens }], 192, &|_| false, need);
            let levels: Vec<Level> = (0..12).map(|i| pool.level(&t, i)).collect();
            (pool.room_bytes() >= need, levels)
        };
        use Level::*;
        let (fits, levels) = run("safe");
        assert!(!fits, "the safe profile never evicts");
        assert_eq!(levels, [F16, Int4, Int4, Int4, Int4, Int4, Int4, Int4, F16, F16, F16, F16]);
        let (fits, levels) = run("balanced");
        assert!(fits);
        // The oldest (least important) go first; the window and sinks stay.
        assert_eq!(levels, [F16, Evicted, Evicted, Evicted, Evicted, Evicted, Int4, Int4, F16, F16, F16, F16]);
        let static_int8 = KvPolicy::baseline().patched_json(&json!({"static_level": "int8"})).unwrap();
        assert_eq!(static_int8.emergency_floor(), None, "a static policy stays at its level");
    }

    #[test]
    fn a_shared_block_in_any_sharers_window_stays_and_an_evicted_one_leaves_the_prefix_index() {
        let mut pool = pool_with(64, 64);
        let tokens: Vec<u32> = (0..12 * BLOCK_TOKENS as u32).collect();
        let mut a = table(&mut pool, tokens.len());
        pool.publish(&mut a, &tokens);
        // B shares A's first seven blocks and adds one: blocks 3..6 are in B's window.
        let mut b = BlockTable::default();
        let mut b_tokens = tokens[..7 * BLOCK_TOKENS].to_vec();
        b_tokens.extend([9999; BLOCK_TOKENS + 1]);
        assert_eq!(pool.attach_prefix(&mut b, &b_tokens), 7 * BLOCK_TOKENS);
        pool.reserve(&mut b, BLOCK_TOKENS).unwrap();
        b.len = 8 * BLOCK_TOKENS;
        let policy = KvPolicy::baseline().patched_json(&json!({"static_level": "int8"})).unwrap();
        let seqs = [SeqView { table: &a, tokens: &tokens }, SeqView { table: &b, tokens: &b_tokens }];
        apply(&policy, &mut pool, &seqs, 4096, &|_| false, 0);
        let levels: Vec<Level> = (0..12).map(|i| pool.level(&a, i)).collect();
        use Level::*;
        assert_eq!(levels, [F16, Int8, Int8, Int8, F16, F16, F16, Int8, F16, F16, F16, F16]);
        // Evicted, A's block 1 can no longer start a new request's prefix: the match stops at block 0.
        assert!(pool.evict(&a, 1));
        let mut c = BlockTable::default();
        assert_eq!(pool.attach_prefix(&mut c, &tokens), BLOCK_TOKENS);
    }
}
