//! The staged KV cache's levels on real weights (SmolLM2-135M, the first 512 tokens of Hamlet in
//! steps of 64, a 64-token f16 window and the first block kept), through the same evaluator as
//! `bench/src/kv_eval.rs`: int8 blocks cost nothing measurable, int4 little, eviction clearly
//! more, and each level saves more memory, measured from the cache; evicting only the least
//! attended half costs a fraction of evicting all. The dynamic policy under a budget of 3/4 of
//! the f16 cache mixes levels by importance and keeps inside the budget. Blocks promoted back
//! from their f16 copies give the f16 run's logits exactly.

use crate::support::cached_model;
use llmr_kv_policy::KvPolicy;
use llmr_native_engine::arch::{BatchToken, Model, Scratch};
use llmr_native_engine::checkpoint::Checkpoint;
use llmr_native_engine::config::ModelConfig;
use llmr_native_engine::kv_cache::{BlockTable, KvPool, Level, Shape, BLOCK_TOKENS};
use llmr_native_engine::kv_control::{self, SeqView};
use llmr_native_engine::kv_eval::{evaluate, EvalOptions, EvalReport};
use llmr_native_engine::tokenizer::ModelTokenizer;
use serde_json::json;

/// SmolLM2 with its tokenizer, and the tokens of Hamlet (the retrieval test's too).
pub(crate) fn smollm2_on_hamlet() -> (ModelConfig, Model, ModelTokenizer, Vec<u32>, Shape) {
    let dir = cached_model("smollm2-hf");
    let config = ModelConfig::read(&dir.join("config.json")).unwrap();
    let model = Model::load(&config, &Checkpoint::open(&dir.join("model.safetensors")).unwrap()).unwrap();
    let tokenizer = ModelTokenizer::load(&dir, config.vocab, &config.eos, config.bos).unwrap();
    let text = std::fs::read_to_string(cached_model("corpus/hamlet_gut.txt")).unwrap();
    let tokens = tokenizer.encode(&text, true, false).unwrap();
    let shape = Shape { layers: config.layers, kv_heads: config.kv_heads, head_dim: config.head_dim };
    (config, model, tokenizer, tokens, shape)
}

#[test]
fn each_level_saves_more_and_int8_costs_nothing_measurable() {
    let (config, model, tokenizer, tokens, shape) = smollm2_on_hamlet();
    let tokens = &tokens[..512];
    let run_policy = |policy: serde_json::Value, budget: Option<usize>, evict| -> EvalReport {
        let options = EvalOptions {
            step: 64,
            policy: KvPolicy::baseline().patched_json(&policy).unwrap(),
            budget,
            evict,
            control_ids: tokenizer.control_ids.clone(),
            copies: false,
            recall: None,
        };
        let r = evaluate(&model, shape, config.vocab, tokens, &options).unwrap();
        eprintln!("{policy} evict {evict}: {r:?}, delta-PPL {:+.3}%", r.delta_ppl_rel() * 100.0);
        r
    };
    let run = |level: &str, evict| run_policy(json!({"static_level": level}), None, evict);
    let (int8, int4, evicted) = (run("int8", 0.0), run("int4", 0.0), run("int8", 1.0));
    assert_eq!(int8.scored, 512 - 64 - 1);
    // The f16 run is the same in all three.
    assert_eq!((int8.ppl_f16, int8.kv_bytes_f16), (int4.ppl_f16, int4.kv_bytes_f16));
    assert!(int8.delta_ppl_rel().abs() < 0.003, "int8: {int8:?}");
    assert!(int8.top1_agreement >= 0.99 && int8.kld_mean < 1e-3, "int8: {int8:?}");
    assert!(int4.delta_ppl_rel() < 0.02 && int4.top1_agreement >= 0.95, "int4: {int4:?}");
    assert!(evicted.delta_ppl_rel() > int4.delta_ppl_rel() && evicted.kld_mean > int4.kld_mean, "{evicted:?}");
    let saving = |r: &EvalReport| 1.0 - r.kv_bytes as f64 / r.kv_bytes_f16 as f64;
    assert!(0.0 < saving(&int8) && saving(&int8) < saving(&int4) && saving(&int4) < saving(&evicted));
    // 512 positions are 32 blocks: the first and the last four (the window) stay f16.
    let layers = config.layers;
    assert_eq!(int8.levels, [5 * layers, 27 * layers, 0, 0]);
    assert_eq!(evicted.levels, [5 * layers, 0, 0, 27 * layers]);
    // Evicting half of those blocks, the least attended first, costs a fraction of evicting all.
    let half = run("int4", 0.5);
    assert_eq!(half.levels[Level::Evicted as usize], 13 * layers);
    assert!(saving(&half) > saving(&int4), "{half:?}");
    assert!(half.delta_ppl_rel() < evicted.delta_ppl_rel() / 4.0, "{half:?} against {evicted:?}");
    // Dynamic, balanced, with 3/4 of the f16 bytes: int4 where importance is lowest once
    // pressure passes 0.6, the rest int8, and the cache inside the budget.
    let budget = int8.kv_bytes_f16 * 3 / 4;
    let dynamic = run_policy(json!({"mode": "dynamic", "profile": "balanced"}), Some(budget), 0.0);
    assert!(dynamic.kv_bytes <= budget, "{dynamic:?}");
    assert!(dynamic.levels[Level::Int4 as usize] > 0 && dynamic.levels[Level::F16 as usize] >= 5 * layers);
    assert!(dynamic.delta_ppl_rel() < 0.05 && dynamic.top1_agreement >= 0.9, "{dynamic:?}");
    assert_eq!(dynamic.passes, 8);
}

/// Promotion is exact: SmolLM2's blocks stored at int4 and one of them evicted, brought back to
/// f16 from their copies in the spill tier, hold their f16 values again bit for bit, so the
/// steps that follow give the logits of a run that never left f16. Without the copies
/// (`kv_promotion` off: levels only go down) they differ. (Tokens computed while blocks were
/// lower keep that in their own keys and values: promotion restores blocks, not history.)
#[test]
fn blocks_promoted_from_their_copies_give_the_f16_runs_logits_bit_for_bit() {
    let (config, model, _, tokens, shape) = smollm2_on_hamlet();
    let tokens = &tokens[..320];
    let int4 = KvPolicy::baseline().patched_json(&json!({"static_level": "int4"})).unwrap();
    // The logits of the steps after the policy's passes, and what the pool held before them.
    let run = |policy: bool, spill: bool| -> (Vec<f32>, [usize; 4], usize) {
        let mut pool = KvPool::new(shape, tokens.len().div_ceil(BLOCK_TOKENS));
        if spill {
            pool.enable_spill().unwrap();
        }
        let (mut table, mut scratch, mut logits) = (BlockTable::default(), Scratch::default(), Vec::new());
        let mut levels = ([0; 4], 0);
        for start in (0..tokens.len()).step_by(64) {
            if start == 128 {
                levels = (pool.level_counts(), pool.spilled());
            }
            pool.reserve(&mut table, 64).unwrap();
            table.len = start + 64;
            let batch: Vec<BatchToken> =
                (start..start + 64).map(|pos| BatchToken { token: tokens[pos], seq: 0, pos, logits: true }).collect();
            let out = model.forward(&mut pool, &[&table], &batch, &mut scratch).unwrap();
            if start >= 128 {
                logits.extend(out);
            }
            if policy && start == 64 {
                let seq = [SeqView { table: &table, tokens: &tokens[..table.len] }];
                let down = kv_control::apply(&int4, &mut pool, &seq, 2048, &|_| false, 0);
                assert!(pool.evict(&table, 2));
                let up = kv_control::apply(&KvPolicy::baseline(), &mut pool, &seq, 2048, &|_| false, 0);
                eprintln!("int4: {down:?}; then block 2 evicted; then the baseline: {up:?}");
            }
        }
        (logits, levels.0, levels.1)
    };
    let (f16, f16_levels, _) = run(false, false);
    let (promoted, levels, spilled) = run(true, true);
    let (lowered, lowered_levels, _) = run(true, false);
    let layers = config.layers;
    assert_eq!(f16_levels, [8 * layers, 0, 0, 0]);
    assert_eq!((levels, spilled), ([8 * layers, 0, 0, 0], 0), "every block back at f16, its copy given back");
    assert_eq!(lowered_levels, [5 * layers, 0, 2 * layers, layers], "without copies: two int4 blocks, one evicted");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(bits(&promoted) == bits(&f16), "the promoted cache gives the f16 run's logits bit for bit");
    let worst = lowered.iter().zip(&f16).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("without promotion the logits move by up to {worst}");
    assert!(worst > 0.0);
}
