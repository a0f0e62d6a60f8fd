//! The KV policy in the serving path, through the whole plugin: SmolLM2 with a KV budget of
//! one f16 context (2048 tokens) and three concurrent requests, any two of which need more
//! than that. With the dynamic policy all three run at once (their blocks go to int8 / int4 as
//! the budget fills); with the baseline policy the same budget preempts the newest, which
//! resumes once there is room and answers as it would have with room to spare. A refused policy
//! change names its field and leaves the running policy as it was. A policy raised mid-request
//! brings the blocks back to f16 from their copies; under the baseline, copies that only the
//! prefix cache holds cost no policy pass until a request reuses their blocks.

use crate::support::{cached_model, instance, plugin, spec};
use llmr_engine_host::{EngineInstance, FinishReason, InferParams, InferResult, Sampling};
use serde_json::{json, Value};

const MAX_TOKENS: u32 = 48;

fn load(policy: Value) -> EngineInstance {
    // SmolLM2: 30 layers x 3 KV heads x 64 dims, f16 keys and values: 45 MiB per 2048 tokens.
    load_with(json!({"kv_policy": policy, "kv_budget_mib": 45}))
}

fn load_with(options: Value) -> EngineInstance {
    let e = instance(&plugin(), 3);
    let mut s = spec("smollm2", &cached_model("smollm2-hf"));
    s.options = Some(options);
    e.load_model(&s).unwrap();
    e
}

/// Three ~1200-token passages of Hamlet, each asked to go on, all at once: their answers and
/// results.
fn serve_three(e: &EngineInstance) -> Vec<(String, InferResult)> {
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
                    let mut text = String::new();
                    let result = e
                        .infer(&params, |t| {
                            text.push_str(&t.text);
                            true
                        })
                        .unwrap();
                    (text, result)
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
    assert!(results.iter().all(|(_, r)| r.prompt_tokens > 1100), "{results:?}");
    for (_, r) in &results {
        assert_eq!(r.completion_tokens, MAX_TOKENS, "every request runs whole: {results:?}");
    }
    let m = model_metrics(&e);
    eprintln!("{m:#}");
    assert!(m["policy_blocks_changed_total"].as_u64().unwrap() > 0, "{m}");
    assert!(m["kv_bytes"].as_u64().unwrap() <= m["kv_budget_bytes"].as_u64().unwrap(), "{m}");
    assert_eq!(m["policy_errors_total"], 0);
    assert_eq!(m["preemptions_total"], 0, "the policy made room for all three at once");
}

#[test]
fn the_baseline_preempts_for_room_and_every_answer_comes_whole_and_unchanged() {
    // Room to spare: the three answers as they are.
    let roomy = serve_three(&load_with(json!({})));
    // The baseline under a budget of one f16 context cannot hold the three at once: the newest
    // steps aside and comes back, reading again what the prefix index no longer holds.
    let baseline = load(json!({}));
    let results = serve_three(&baseline);
    let m = model_metrics(&baseline);
    eprintln!("{m:#}");
    assert!(m["preemptions_total"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["policy_blocks_changed_total"], 0);
    for ((text, r), (roomy_text, roomy_r)) in results.iter().zip(&roomy) {
        assert_eq!(r.completion_tokens, MAX_TOKENS, "no answer is cut for room: {results:?}");
        assert_eq!((r.prompt_tokens, r.finish_reason), (roomy_r.prompt_tokens, roomy_r.finish_reason));
        assert_eq!(text, roomy_text, "a preempted answer goes on as it would have");
    }
    assert_eq!(m["slots_busy"], 0);
    assert_eq!(m["queued"], 0);
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

/// With a calibration table in the model's folder (what `kv-eval --calibrate` writes) the engine
/// reports `delta_ppl_est`: each level's cost weighted by the share of positions at that level,
/// read while a request runs; without a table, null.
#[test]
fn the_quality_estimate_comes_from_the_models_calibration_table() {
    // Two folders linking SmolLM2's files (not a table the cache may hold), one given a table.
    let linked = |name: &str| {
        let dir = std::env::temp_dir().join(format!("llmr-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(cached_model("smollm2-hf")).unwrap() {
            let entry = entry.unwrap();
            if !entry.file_name().to_string_lossy().starts_with('.') {
                std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name())).unwrap();
            }
        }
        dir
    };
    let (dir, plain) = (linked("calibrated"), linked("uncalibrated"));
    let (int8, int4, evicted) = (2.0, 5.0, 40.0);
    let table = json!({"model": "smollm2-hf", "corpus": "test", "ctx": 2048,
        "cost": {"int8": int8, "int4": int4, "evicted": evicted}, "points": []});
    std::fs::write(dir.join(".llmr-kv-calibration.json"), table.to_string()).unwrap();

    // Metrics read at the 8th token of a 600-token prompt, its old blocks at int8.
    let metrics_while_running = |dir: &std::path::Path| -> Value {
        let e = instance(&plugin(), 1);
        let mut s = spec("smollm2", dir);
        s.options = Some(json!({"kv_policy": {"static_level": "int8", "recent_window": 16}}));
        e.load_model(&s).unwrap();
        let text = std::fs::read_to_string(cached_model("corpus/hamlet_gut.txt")).unwrap();
        let prompt: String = text.chars().skip(20_000).take(2_400).collect();
        let sampling = Sampling { max_tokens: Some(12), ..Sampling::greedy() };
        let params = InferParams { ignore_eos: true, ..InferParams::new(1, "smollm2", &prompt, sampling) };
        let (mut seen, mut during) = (0, Value::Null);
        e.infer(&params, |_| {
            seen += 1;
            if seen == 8 {
                during = model_metrics(&e);
            }
            true
        })
        .unwrap();
        during
    };
    let m = metrics_while_running(&dir);
    let level = |l: &str| m["kv_levels"][l].as_f64().unwrap();
    let total = level("L0") + level("L1") + level("L2") + level("L3");
    assert!(level("L1") > total / 2.0, "most positions at int8: {m}");
    let want = (int8 * level("L1") + int4 * level("L2") + evicted * level("L3")) / total;
    let got = m["delta_ppl_est"].as_f64().unwrap_or_else(|| panic!("no estimate: {m}"));
    assert!((got - want).abs() < 1e-9, "{got} vs {want}: {m}");

    let uncalibrated = metrics_while_running(&plain);
    assert!(uncalibrated["kv_levels"]["L1"].as_u64().unwrap() > 0, "{uncalibrated}");
    assert!(uncalibrated["delta_ppl_est"].is_null(), "{uncalibrated}");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&plain).unwrap();
}

/// A policy raised while a request runs brings its blocks back up: SmolLM2's old blocks at
/// int8, then the baseline set mid-request, and within the request every block is f16 again,
/// from the f16 copies the engine kept (`kv_promotion`, on by default). With `kv_promotion`
/// false, levels only go down and the int8 blocks stay.
#[test]
fn a_policy_raised_mid_request_promotes_the_blocks_back_to_f16() {
    let run = |promotion: bool| -> (Value, Value) {
        let e = instance(&plugin(), 1);
        let mut s = spec("smollm2", &cached_model("smollm2-hf"));
        s.options =
            Some(json!({"kv_policy": {"static_level": "int8", "recent_window": 16}, "kv_promotion": promotion}));
        e.load_model(&s).unwrap();
        let text = std::fs::read_to_string(cached_model("corpus/hamlet_gut.txt")).unwrap();
        let prompt: String = text.chars().skip(20_000).take(2_400).collect();
        let sampling = Sampling { max_tokens: Some(48), ..Sampling::greedy() };
        let params = InferParams { ignore_eos: true, ..InferParams::new(1, "smollm2", &prompt, sampling) };
        let (mut seen, mut lowered, mut raised) = (0, Value::Null, Value::Null);
        e.infer(&params, |_| {
            seen += 1;
            if seen == 8 {
                lowered = model_metrics(&e);
                e.set_config(Some("smollm2"), "kv_policy", &json!({"static_level": "f16"})).unwrap();
            }
            if seen == 40 {
                raised = model_metrics(&e);
            }
            true
        })
        .unwrap();
        (lowered, raised)
    };
    let levels =
        |m: &Value| -> Vec<u64> { ["L0", "L1", "L2", "L3"].map(|l| m["kv_levels"][l].as_u64().unwrap()).to_vec() };
    let (lowered, raised) = run(true);
    eprintln!("int8: {:?}; after the baseline: {:?}", levels(&lowered), levels(&raised));
    assert!(levels(&lowered)[1] > 0, "{lowered}");
    assert_eq!(levels(&raised)[1..], [0, 0, 0], "{raised}");
    assert!(raised["policy_blocks_promoted_total"].as_u64().unwrap() > 0, "{raised}");
    let (lowered, raised) = run(false);
    assert!(levels(&lowered)[1] > 0, "{lowered}");
    assert_eq!(levels(&raised)[1], levels(&lowered)[1], "without copies the int8 blocks stay: {raised}");
    assert_eq!(raised["policy_blocks_promoted_total"], 0);
}

/// Blocks that only the prefix cache holds keep their f16 copies, and under the baseline they
/// cost nothing: a request over another text runs no policy pass. A request that reuses them
/// brings them back to f16.
#[test]
fn the_baseline_promotes_cached_blocks_only_when_a_request_reuses_them() {
    let e = instance(&plugin(), 1);
    let mut s = spec("smollm2", &cached_model("smollm2-hf"));
    s.options = Some(json!({"kv_policy": {"static_level": "int8", "recent_window": 16}}));
    e.load_model(&s).unwrap();
    let text = std::fs::read_to_string(cached_model("corpus/hamlet_gut.txt")).unwrap();
    let passage = |skip: usize| -> String { text.chars().skip(skip).take(2_400).collect() };
    let serve = |prompt: &str| {
        let sampling = Sampling { max_tokens: Some(16), ..Sampling::greedy() };
        let params = InferParams { ignore_eos: true, ..InferParams::new(1, "smollm2", prompt, sampling) };
        e.infer(&params, |_| true).unwrap();
        model_metrics(&e)
    };
    let first = serve(&passage(20_000));
    assert!(first["policy_blocks_changed_total"].as_u64().unwrap() > 0, "blocks went to int8: {first}");
    e.set_config(Some("smollm2"), "kv_policy", &json!({"static_level": "f16"})).unwrap();
    let other = serve(&passage(40_000));
    assert_eq!(other["policy_passes_total"], first["policy_passes_total"], "no pass for idle copies: {other}");
    assert_eq!(other["policy_blocks_promoted_total"], 0);
    let again = serve(&passage(20_000));
    assert!(again["policy_blocks_promoted_total"].as_u64().unwrap() > 0, "reused blocks come back up: {again}");
}

/// Requests cancelled while one of them waits preempted all end as cancelled, and leave no
/// sequence, queue entry or held block behind: the next request runs as on a fresh engine.
#[test]
fn cancelling_while_a_request_waits_preempted_leaves_nothing_behind() {
    let e = load(json!({}));
    let text = std::fs::read_to_string(cached_model("corpus/hamlet_gut.txt")).unwrap();
    let passages: Vec<String> =
        (0..3).map(|i| text.chars().skip(40_000 + i * 5_000).take(4_800).collect::<String>()).collect();
    let ids = [7001u64, 7002, 7003];
    let results: Vec<InferResult> = std::thread::scope(|s| {
        let handles: Vec<_> = passages
            .iter()
            .zip(ids)
            .map(|(p, id)| {
                let e = &e;
                s.spawn(move || {
                    // Long enough that they are still running when the watcher cancels them.
                    let sampling = Sampling { max_tokens: Some(600), ..Sampling::greedy() };
                    let params = InferParams { ignore_eos: true, ..InferParams::new(id, "smollm2", p, sampling) };
                    e.infer(&params, |_| true).unwrap()
                })
            })
            .collect();
        // Once a request waits preempted, cancel all three.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        loop {
            let m = model_metrics(&e);
            if m["preemptions_total"].as_u64().unwrap() > 0 && m["queued"].as_u64().unwrap() > 0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no request was preempted: {m}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for id in ids {
            e.cancel(id).unwrap();
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        assert_eq!(r.finish_reason, FinishReason::Cancelled, "{results:?}");
        assert!(r.completion_tokens < 600, "{results:?}");
    }
    let m = model_metrics(&e);
    assert_eq!(
        (m["slots_busy"].as_u64(), m["queued"].as_u64(), m["kv_blocks_used"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{m}"
    );
    // The engine goes on.
    let sampling = Sampling { max_tokens: Some(8), ..Sampling::greedy() };
    let r = e.infer(&InferParams::new(7004, "smollm2", "The capital of France is", sampling), |_| true).unwrap();
    assert_eq!(r.completion_tokens, 8);
}

/// Recall in the serving path: a key said once early in a ~1,200-token prompt, under a dynamic
/// policy set to evict every block outside the sinks and the recent window whatever the pressure
/// (so that the key's block is evicted whatever the attention scores say: which blocks matter
/// least moves with the last bits of the kernels, which differ between CPUs; with a pressure band
/// the pass stops evicting once under it, and the most important blocks go to int4 instead). With recall
/// (on by default) the question's queries find the key's blocks through their int4 key index,
/// the engine reads them back, and the answer has the key; with `kv_recall: false` blocks are
/// evicted whole, nothing is read back, and the key is lost.
#[test]
fn evicted_blocks_the_question_needs_are_read_back_while_serving() {
    let text = std::fs::read_to_string(cached_model("corpus/hamlet_gut.txt")).unwrap();
    let filler: Vec<char> = text.chars().skip(30_000).take(3_900).collect();
    let (early, late): (String, String) = (filler[..600].iter().collect(), filler[600..].iter().collect());
    let prompt = format!(
        "There is a pass key hidden in the text below. Find it and remember it: you will be asked for it.\n\n\
         {early}\n\nThe pass key is 71432. Remember it: 71432 is the pass key.\n\n{late}\n\n\
         What is the pass key? The pass key is"
    );
    let run = |recall: bool| -> (String, Value) {
        // A context of 1,280 tokens and a budget of just one (28.1 MiB): the prompt fills it.
        let e = instance(&plugin(), 1);
        let mut s = spec("smollm2", &cached_model("smollm2-hf"));
        s.context_length = 1280;
        s.options = Some(json!({
            "kv_policy": {"mode": "dynamic", "profile": "aggressive", "pressure": {"mid": 0.0, "high": 0.0},
                          "level_thresholds": {"L1_int8": 1.01, "L2_int4": 1.01, "L3_evict": 1.01}},
            "kv_budget_mib": 29, "kv_recall": recall
        }));
        e.load_model(&s).unwrap();
        let sampling = Sampling { max_tokens: Some(8), ..Sampling::greedy() };
        let params = InferParams { ignore_eos: true, ..InferParams::new(1, "smollm2", &prompt, sampling) };
        let (mut answer, mut during) = (String::new(), Value::Null);
        e.infer(&params, |t| {
            answer.push_str(&t.text);
            if during.is_null() {
                during = model_metrics(&e);
            }
            true
        })
        .unwrap();
        (answer, during)
    };
    let (answer, m) = run(true);
    eprintln!("with recall: {answer:?}, {m}");
    assert!(m["kv_levels"]["L3"].as_u64().unwrap() > 0, "the budget made the policy evict: {m}");
    assert!(m["kv_recalls_total"].as_u64().unwrap() > 0, "{m}");
    assert!(answer.contains("71432"), "{answer:?}");
    let (answer, m) = run(false);
    eprintln!("without recall: {answer:?}, {m}");
    assert!(m["kv_levels"]["L3"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["kv_recalls_total"], 0, "{m}");
    assert!(!answer.contains("71432"), "the key's blocks were evicted whole: {answer:?}");
}
