//! Pass-key retrieval on real weights (SmolLM2-135M, 512-token prompts of Hamlet with a key said
//! once, `kv_retrieval`): the f16 cache finds every key, an int8 cache gives the very same
//! answers, and evicting the blocks that hold the key loses it, which perplexity alone would
//! hardly show, unless recall reads the key's blocks back when the question needs them.

use crate::kv_levels::smollm2_on_hamlet;
use llmr_kv_policy::KvPolicy;
use llmr_native_engine::kv_eval::EvalOptions;
use llmr_native_engine::kv_recall::RECALL_SHARE;
use llmr_native_engine::kv_retrieval::{answer, passkey_prompts, ANSWER_TOKENS};
use serde_json::json;

#[test]
fn a_key_said_once_survives_int8_is_lost_with_its_blocks_and_comes_back_with_recall() {
    let (config, model, tokenizer, hamlet, shape) = smollm2_on_hamlet();
    // Depths 5% and 50%: the key's sentence lies outside the first block and the f16 window.
    let prompts = passkey_prompts(&tokenizer, &hamlet, 512, 3).unwrap();
    assert!(prompts.iter().all(|p| p.tokens.len() + ANSWER_TOKENS == 512));
    let keys: Vec<&str> = prompts.iter().map(|p| p.key.as_str()).collect();
    assert!(keys[0] != keys[1] && keys[1] != keys[2], "{keys:?}");
    let text_of = |ids: &[u32]| ids.iter().map(|&id| tokenizer.piece(id)).collect::<String>();
    let run_with = |policy: serde_json::Value, evict: f64, recall: Option<f32>| {
        let options = EvalOptions {
            step: 64,
            policy: KvPolicy::baseline().patched_json(&policy).unwrap(),
            budget: None,
            evict,
            control_ids: tokenizer.control_ids.clone(),
            copies: recall.is_some(),
            recall,
        };
        prompts[..2]
            .iter()
            .map(|p| answer(&model, shape, config.vocab, &p.tokens, ANSWER_TOKENS, &options).unwrap())
            .collect::<Vec<_>>()
    };
    let run = |policy: serde_json::Value, evict: f64| run_with(policy, evict, None);
    let int8 = run(json!({"static_level": "int8"}), 0.0);
    for (p, a) in prompts.iter().zip(&int8) {
        let (f16, policy) = (text_of(&a.f16), text_of(&a.policy));
        assert!(f16.contains(&p.key), "f16 at depth {}: {f16:?}, key {}", p.depth, p.key);
        assert_eq!(a.policy, a.f16, "int8 at depth {}: {policy:?} against {f16:?}", p.depth);
        assert!(a.kv_bytes < a.kv_bytes_f16 && a.levels[1] > 0, "{a:?}");
    }
    // Every block outside the first and the window evicted: the key is gone.
    for (p, a) in prompts.iter().zip(run(json!({"static_level": "int8"}), 1.0)) {
        let policy = text_of(&a.policy);
        assert!(!policy.contains(&p.key), "depth {}: {policy:?} still has {}", p.depth, p.key);
        assert!(text_of(&a.f16).contains(&p.key));
        assert_eq!(a.recalls, 0);
    }
    // The same eviction with recall: the question's queries find the key's blocks through
    // their int4 key index and read them back, and the key comes back. The index stays in
    // memory; values and exact keys do not.
    for (p, a) in prompts.iter().zip(run_with(json!({"static_level": "int8"}), 1.0, Some(RECALL_SHARE))) {
        let policy = text_of(&a.policy);
        assert!(policy.contains(&p.key), "depth {}: {policy:?} lost {} despite recall", p.depth, p.key);
        assert!(a.recalls > 0 && a.levels[3] > 0, "{a:?}");
        assert!(a.kv_bytes < a.kv_bytes_f16 / 2, "{a:?}");
    }
}
