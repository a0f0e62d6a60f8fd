//! The KV policy in the serving path, through the whole plugin: SmolLM2 with a KV budget of
//! one f16 context (2048 tokens) and three concurrent requests, any two of which need more
//! than that. With the dynamic policy all three run whole (their blocks go to int8 / int4 as the
//! budget fills); with the baseline policy the same budget ends one early. A refused policy
//! change names its field and leaves the running policy as it was.

use crate::support::{cached_model, instance, plugin, spec};
use llmr_engine_host::{EngineInstance, InferParams, InferResult, Sampling};
use serde_json::{json, Value};

const MAX_TOKENS: u32 = 48;

fn load(policy: Value) -> EngineInstance {
    let e = instance(&plugin(), 3);
    let mut s = spec("smollm2", &cached_model("smollm2-hf"));
    // SmolLM2: 30 layers x 3 KV heads x 64 dims, f16 keys and values: 45 MiB per 2048 tokens.
    s.options = Some(json!({"kv_policy": policy, "kv_budget_mib": 45}));
    e.load_model(&s).unwrap();
    e
}

/// Three ~1200-token passages of Hamlet, each asked to go on, all at once.
fn serve_three(e: &EngineInstance) -> Vec<InferResult> {
    let text = std::fs::read_to_string(cached_model("corpus/hamlet_gut.txt")).unwrap();
    let passages: Vec<String> =
        (0..3).map(|i| text.chars().skip(20_000 + i * 5_000).take(4_800).collect::<String>()).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = passages
            .iter()
            .enumerate()
            .map(|(i, p)| {
                s.spawn(move || {
                    let sampling = Sampling { max_tokens: Some(MAX_TOKENS), ..Sampling::greedy() };
                    let params = InferParams { ignore_eos: true, ..InferParams::new(i as u64, "smollm2", p, sampling) };
                    e.infer(&params, |_| true).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn model_metrics(e: &EngineInstance) -> Value {
    e.metrics().unwrap()["models"][0].clone()
}

#[test]
fn the_dynamic_policy_fits_three_long_requests_in_one_contexts_budget() {
    let e = load(json!({"mode": "dynamic", "profile": "balanced"}));
    let results = serve_three(&e);
    // Any two of them need more than the budget in f16.
    assert!(results.iter().all(|r| r.prompt_tokens > 1100), "{results:?}");
    for r in &results {
        assert_eq!(r.completion_tokens, MAX_TOKENS, "every request runs whole: {results:?}");
    }
    let m = model_metrics(&e);
    eprintln!("{m:#}");
    assert!(m["policy_blocks_changed_total"].as_u64().unwrap() > 0, "{m}");
    assert!(m["kv_bytes"].as_u64().unwrap() <= m["kv_budget_bytes"].as_u64().unwrap(), "{m}");
    assert_eq!(m["policy_errors_total"], 0);

    // The baseline under the same budget cannot hold the three: one ends early.
    let baseline = load(json!({}));
    let results = serve_three(&baseline);
    assert!(results.iter().any(|r| r.completion_tokens < MAX_TOKENS), "{results:?}");
    assert_eq!(model_metrics(&baseline)["policy_blocks_changed_total"], 0);
}

#[test]
fn a_refused_policy_change_names_the_field_and_changes_nothing() {
    let e = load(json!({"mode": "dynamic", "profile": "safe"}));
    let policy = |e: &EngineInstance| e.model_info("smollm2").unwrap().extra["kv_policy"].clone();
    let before = policy(&e);
    assert_eq!(before["profile"], "safe");
    for (patch, field) in [
        (json!({"recent_window": 4}), "recent_window"),
        (json!({"level_thresholds": {"L1_int8": 0.2, "L2_int4": 0.5, "L3_evict": 0.3}}), "level_thresholds"),
        (json!({"colour": "blue"}), "colour"),
    ] {
        let e2 = e.set_config(Some("smollm2"), "kv_policy", &patch).unwrap_err();
        assert!(e2.to_string().contains(&format!("`{field}`")), "{patch}: {e2}");
        assert_eq!(policy(&e), before);
    }
    e.set_config(Some("smollm2"), "kv_policy", &json!({"profile": "aggressive", "recent_window": 128})).unwrap();
    let after = policy(&e);
    assert_eq!((after["profile"].as_str(), after["recent_window"].as_u64()), (Some("aggressive"), Some(128)));
    assert_eq!(after["mode"], "dynamic", "a patch keeps what it does not name");
    assert_eq!(model_metrics(&e)["kv_policy"], after);
}
