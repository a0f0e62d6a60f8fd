//! The llama.cpp plugin on real model weights, through the host exactly as a node drives it.
//!
//! Needs the release plugin beside this test binary (`cargo test --release -p llmr-llama-cpp`)
//! and the models of `scripts/fetch-models smollm2 minilm` (scripts/test does both).

use llmr_engine_host::{
    load_one, EngineInstance, EngineRegistry, EngineStatus, FinishReason, Format, InferParams, InstanceConfig,
    Manifest, ModelSpec, Sampling,
};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn model_path(file: &str) -> PathBuf {
    let cache = std::env::var("LLMR_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/llmr/models"));
    let p = cache.join(file);
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models first", p.display());
    p
}

/// A plugin folder holding the committed manifest and the library cargo just built.
fn plugin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let lib = exe.parent().unwrap().parent().unwrap().join("libllmr_llama_cpp.so");
        assert!(lib.is_file(), "{} is missing: run `cargo build --release -p llmr-llama-cpp`", lib.display());
        let dir = std::env::temp_dir().join(format!("llmr-llama-test-{}", std::process::id())).join("llama_cpp/cpu");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(format!("{REPO}/engines/llama_cpp/cpu/manifest.json"), dir.join("manifest.json")).unwrap();
        std::fs::copy(&lib, dir.join("libllmr_llama_cpp.so")).unwrap();
        dir
    })
    .clone()
}

fn plugin() -> Arc<llmr_engine_host::Plugin> {
    static PLUGIN: OnceLock<Arc<llmr_engine_host::Plugin>> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let dir = plugin_dir();
            let mut registry = EngineRegistry::new();
            load_one(&dir, Manifest::load(&dir, 1).unwrap(), &mut registry).unwrap()
        })
        .clone()
}

/// A new instance with SmolLM2 and MiniLM loaded. llama.cpp's numerics depend on what else
/// shares a batch, so tests that compare outputs or read instance-wide state get their own.
fn private_engine(slots: u32) -> EngineInstance {
    let engine =
        EngineInstance::create(&plugin(), &InstanceConfig { slots, context_length: 2048, ..Default::default() })
            .unwrap();
    for (id, file) in [("smollm2", "smollm2-135m-instruct-q4_1.gguf"), ("minilm", "all-minilm-l6-v2-f16.gguf")] {
        let p = model_path(file);
        engine.load_model(&ModelSpec::new(id, Format::Gguf, p.display().to_string())).unwrap();
    }
    engine
}

/// The instance the other tests share, as a node shares one between requests.
fn engine() -> &'static EngineInstance {
    static ENGINE: OnceLock<EngineInstance> = OnceLock::new();
    ENGINE.get_or_init(|| private_engine(8))
}

const CHAT: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

fn generate(params: &InferParams<'_>) -> (String, Vec<String>, llmr_engine_host::InferResult) {
    generate_on(engine(), params)
}

fn generate_on(
    engine: &EngineInstance,
    params: &InferParams<'_>,
) -> (String, Vec<String>, llmr_engine_host::InferResult) {
    let mut pieces = Vec::new();
    let res = engine
        .infer(params, |t| {
            pieces.push(t.text.to_string());
            true
        })
        .unwrap();
    (pieces.concat(), pieces, res)
}

fn greedy(id: u64, prompt: &str, max: u32) -> InferParams<'_> {
    greedy_on("smollm2", id, prompt, max)
}

/// Greedy, at most `max` tokens, on the model loaded as `model`.
fn greedy_on<'a>(model: &'a str, id: u64, prompt: &'a str, max: u32) -> InferParams<'a> {
    InferParams::new(id, model, prompt, Sampling { max_tokens: Some(max), ..Sampling::greedy() })
}

#[test]
fn greedy_chat_answer_is_stable_and_correct() {
    let engine = private_engine(2);
    let (a, pieces, res) = generate_on(&engine, &greedy(1, CHAT, 24));
    let (b, _, _) = generate_on(&engine, &greedy(2, CHAT, 24));
    assert_eq!(a, b, "greedy decoding must be deterministic");
    assert!(a.contains("Paris"), "{a:?}");
    assert_eq!(res.finish_reason, FinishReason::Stop, "the model ends its short answer itself: {a:?}");
    assert_eq!(pieces.len() as u32, res.completion_tokens, "one callback per sampled token");
    let exact = engine.tokenize("smollm2", CHAT, true, true).unwrap().len() as u32;
    assert_eq!(res.prompt_tokens, exact, "usage comes from the tokenizer");
}

/// `special_text` (ABI minor 5): control tokens the model generates are written as their text.
/// Past its answer (end of generation ignored) SmolLM2 writes `<|im_end|>` and a new turn.
#[test]
fn control_tokens_are_written_as_text_only_when_asked() {
    // An engine of its own, one sequence, no drafts: both runs decode in the same batch shapes.
    let engine = private_engine(1);
    let past_the_end = |id, special_text| {
        let mut p = greedy(id, CHAT, 24);
        p.ignore_eos = true;
        p.special_text = special_text;
        p.sampling.speculative = false;
        generate_on(&engine, &p)
    };
    let (plain, plain_pieces, _) = past_the_end(31, false);
    let (marked, marked_pieces, _) = past_the_end(32, true);
    assert!(marked.contains("Paris") && marked.contains("<|im_end|>"), "{marked:?}");
    assert!(!plain.contains("<|im_"), "{plain:?}");
    assert_eq!(plain_pieces.len(), marked_pieces.len());
    for (a, b) in plain_pieces.iter().zip(&marked_pieces) {
        assert!(a == b || (a.is_empty() && b.starts_with("<|") && b.ends_with("|>")), "{a:?} / {b:?}");
    }
}

#[test]
fn streaming_delivers_many_pieces_that_concatenate_to_the_whole_answer() {
    let engine = private_engine(2);
    let prompt = "Once upon a time, in a small village,";
    let (text, pieces, res) = generate_on(&engine, &greedy(3, prompt, 40));
    assert_eq!(res.finish_reason, FinishReason::Length);
    assert_eq!(res.completion_tokens, 40);
    assert!(pieces.iter().filter(|p| !p.is_empty()).count() >= 30, "{pieces:?}");
    // The same request without looking at pieces gives the same text.
    let mut whole = String::new();
    engine
        .infer(&greedy(4, prompt, 40), |t| {
            whole.push_str(&t.text);
            true
        })
        .unwrap();
    assert_eq!(text, whole);
    // Timestamps are monotonic.
    let mut stamps = Vec::new();
    engine
        .infer(&greedy(5, prompt, 10), |t| {
            stamps.push(t.timestamp_ns);
            true
        })
        .unwrap();
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn a_stop_sequence_spanning_tokens_ends_generation_and_is_not_returned() {
    let engine = private_engine(2);
    let prompt = "Once upon a time, in a small village,";
    let (full, _, _) = generate_on(&engine, &greedy(6, prompt, 40));
    // Pick a stop string from the middle of the known answer that spans a token boundary.
    let words: Vec<&str> = full.split(' ').collect();
    assert!(words.len() > 8, "{full:?}");
    let stop = format!("{} {}", words[5], words[6]);
    let cut = full.find(&stop).unwrap();
    let mut p = greedy(7, prompt, 40);
    p.sampling.stop = vec![stop.clone()];
    let (text, _, res) = generate_on(&engine, &p);
    assert_eq!(res.finish_reason, FinishReason::Stop);
    assert_eq!(text, full[..cut], "stop {stop:?}");
    assert!(res.completion_tokens < 40);
}

#[test]
fn the_same_seed_gives_the_same_sample() {
    let engine = private_engine(2);
    // A llama.cpp sampler chain (top-k, top-p), and the OpenAI defaults (temperature alone), which
    // draw straight from the logits.
    for (top_k, top_p, id) in [(Some(40), 0.95, 8), (None, 1.0, 20)] {
        let mut p = InferParams::greedy(id, "smollm2", "Write a word:");
        p.sampling.temperature = 0.9;
        p.sampling.top_p = top_p;
        p.sampling.top_k = top_k;
        p.sampling.seed = Some(1234);
        p.sampling.max_tokens = Some(24);
        let (a, _, _) = generate_on(&engine, &p);
        let (b, _, _) = generate_on(&engine, &InferParams { request_id: id + 1, ..p.clone() });
        assert_eq!(a, b, "top_k {top_k:?}, top_p {top_p}");
        let outputs: std::collections::HashSet<String> = (0..4)
            .map(|i| {
                let mut q = InferParams { request_id: id + 2 + i, ..p.clone() };
                q.sampling.seed = Some(i);
                generate_on(&engine, &q).0
            })
            .collect();
        assert!(outputs.len() > 1, "different seeds should differ: {outputs:?}");
    }
}

#[test]
fn logprobs_are_real_log_probabilities_with_alternatives() {
    let mut p = greedy(20, CHAT, 5);
    p.sampling.logprobs = Some(3);
    let mut seen = Vec::new();
    engine()
        .infer(&p, |t| {
            seen.push((t.token_id, t.logprob, t.top.clone()));
            true
        })
        .unwrap();
    for (id, lp, top) in &seen {
        assert!(*lp <= 0.0 && lp.is_finite());
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].token_id, *id, "greedy picks the most likely token");
        assert!((top[0].logprob - lp).abs() < 1e-4);
        assert!(top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    }
}

#[test]
fn cancel_mid_generation_stops_the_sequence_and_frees_its_slot() {
    let engine = private_engine(2);
    let prompt = "List the numbers from one to one hundred in words:";
    let (baseline_text, _, baseline) = generate_on(&engine, &greedy(30, prompt, 48));
    assert_eq!((baseline.finish_reason, baseline.completion_tokens), (FinishReason::Length, 48));

    let mut p = greedy(31, prompt, 2000);
    p.ignore_eos = true;
    let mut n = 0;
    let res = engine
        .infer(&p, |_| {
            n += 1;
            n < 5
        })
        .unwrap();
    assert_eq!(res.finish_reason, FinishReason::Cancelled);
    assert_eq!(n, 5, "no token after the callback said stop");
    // The scheduler may sample a few tokens before it sees the flag, not the 2,000 asked for.
    assert!((5..1000).contains(&res.completion_tokens), "{} tokens generated", res.completion_tokens);

    let stats = model_stats(&engine, "smollm2");
    assert_eq!(stats["slots_busy"].as_u64(), Some(0), "slot released: {stats}");
    assert_eq!(stats["queued"].as_u64(), Some(0), "{stats}");
    // The next request gets the freed slot and runs to its end, with the baseline's answer.
    let (after_text, _, after) = generate_on(&engine, &greedy(32, prompt, 48));
    assert_eq!((after.finish_reason, after.completion_tokens), (FinishReason::Length, 48));
    let head = |t: &str| t.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
    assert_eq!(head(&after_text), head(&baseline_text));
    // The cancelled sequence produced nothing after its request ended: every token the engine
    // generated belongs to one of the three answers (a sequence left running would have kept
    // decoding beside the last request).
    let stats = model_stats(&engine, "smollm2");
    let accounted = u64::from(baseline.completion_tokens + res.completion_tokens + after.completion_tokens);
    assert_eq!(stats["tokens_generated_total"].as_u64(), Some(accounted), "{stats}");
    assert_eq!((stats["requests_total"].as_u64(), stats["slots_busy"].as_u64()), (Some(3), Some(0)), "{stats}");
}

#[test]
fn eight_concurrent_requests_complete_with_the_right_counts_and_coherent_text() {
    let prompts: Vec<String> = ["Paris", "Rome", "Berlin", "Madrid", "Lisbon", "Vienna", "Prague", "Dublin"]
        .iter()
        .map(|c| format!("<|im_start|>user\nTell me one fact about {c}.<|im_end|>\n<|im_start|>assistant\n"))
        .collect();
    let solo_engine = private_engine(1);
    let solo: Vec<String> =
        prompts.iter().enumerate().map(|(i, p)| generate_on(&solo_engine, &greedy(100 + i as u64, p, 32)).0).collect();
    let engine = private_engine(8);
    let engine = &engine;
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| s.spawn(move || generate_on(engine, &greedy(200 + i as u64, p, 32))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (text, pieces, res)) in results.iter().enumerate() {
        assert_eq!(pieces.len() as u32, res.completion_tokens);
        assert!(res.completion_tokens <= 32);
        assert!(text.split_whitespace().count() >= 3, "{text:?}");
        // Batched greedy decoding matches the same request alone, up to float reassociation in
        // batched matmuls: compare the first few words.
        let head = |t: &str| t.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
        assert_eq!(head(text), head(&solo[i]), "request {i}");
    }
}

/// The per-model figures of the engine's metrics.
fn model_stats(engine: &EngineInstance, model: &str) -> serde_json::Value {
    let all = engine.metrics().unwrap();
    all["models"].as_array().unwrap().iter().find(|m| m["model"] == model).unwrap().clone()
}

fn decode_steps(engine: &EngineInstance, model: &str) -> u64 {
    model_stats(engine, model)["decode_steps_total"].as_u64().unwrap()
}

/// Decode steps one request takes alone: its uncached prompt in chunks of `chunk` tokens (the last
/// chunk gives the first token), then one step per further token.
fn steps_alone(res: &llmr_engine_host::InferResult, chunk: u32) -> u64 {
    u64::from((res.prompt_tokens - res.cached_tokens).div_ceil(chunk) + res.completion_tokens - 1)
}

#[test]
fn a_repeated_prefix_is_served_from_the_cache() {
    let system = format!("<|im_start|>system\n{}<|im_end|>\n", "You answer briefly and precisely. ".repeat(20));
    let first = format!("{system}<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
    let second = format!("{system}<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n");
    let engine = private_engine(2);
    // Small chunks, so the decode steps show how many prompt tokens were computed; one token per
    // step after the prompt (drafts would take several: the system prompt repeats itself).
    const CHUNK: u32 = 16;
    engine.set_config(Some("smollm2"), "prefill_chunk", &serde_json::json!(CHUNK)).unwrap();
    engine.set_config(Some("smollm2"), "speculative_draft_max", &serde_json::json!(0)).unwrap();
    let steps0 = decode_steps(&engine, "smollm2");
    let (_, _, a) = generate_on(&engine, &greedy(40, &first, 8));
    let steps1 = decode_steps(&engine, "smollm2");
    let (text, _, b) = generate_on(&engine, &greedy(41, &second, 8));
    let steps2 = decode_steps(&engine, "smollm2");
    let prefix = engine.tokenize("smollm2", &system, true, true).unwrap().len() as u32;
    assert_eq!(a.cached_tokens, 0, "a new instance has nothing cached");
    assert!(b.cached_tokens >= prefix, "cached {} of a {prefix}-token prefix", b.cached_tokens);
    assert!(b.cached_tokens < b.prompt_tokens, "at least one prompt token is decoded, for its logits");
    // The engine computed only the uncached part of the second prompt: the whole first prompt took
    // ceil(prompt / 16) steps, the second ceil(rest / 16).
    assert_eq!(steps1 - steps0, steps_alone(&a, CHUNK), "{a:?}");
    assert_eq!(steps2 - steps1, steps_alone(&b, CHUNK), "{b:?}");
    assert!(steps_alone(&b, CHUNK) + 5 <= steps_alone(&a, CHUNK), "{a:?} {b:?}");
    // The reused cells are the right ones: the answer matches a fresh instance's.
    let (fresh, _, fresh_res) = generate_on(&private_engine(1), &greedy(42, &second, 8));
    assert_eq!(fresh_res.cached_tokens, 0);
    let head = |t: &str| t.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
    assert_eq!(head(&text), head(&fresh), "reused {text:?} vs fresh {fresh:?}");
}

/// One generation with two alternatives per token: its token ids, its text, and per token the
/// gap between the two likeliest logprobs and whether the chosen token was the likeliest.
fn ids_on(engine: &EngineInstance, params: &InferParams<'_>) -> (Vec<i32>, String, Vec<f32>, Vec<bool>) {
    let (mut ids, mut text, mut gaps, mut argmax) = (Vec::new(), String::new(), Vec::new(), Vec::new());
    engine
        .infer(params, |t| {
            ids.push(t.token_id);
            text.push_str(&t.text);
            gaps.push(match &t.top[..] {
                [a, b, ..] => a.logprob - b.logprob,
                _ => f32::INFINITY,
            });
            argmax.push(t.top.first().is_some_and(|a| a.token_id == t.token_id));
            true
        })
        .unwrap();
    (ids, text, gaps, argmax)
}

/// Prompt lookup drafts from the prompt when the answer copies it; the sampler keeps a draft token
/// only when it drew that token itself, so the output is the same token for token with
/// speculation on and off, greedy or sampled with a seed, and a copying answer takes fewer
/// decode steps than tokens.
///
/// llama.cpp's logits move slightly with the shape of the batch (a draft step computes several
/// positions at once), so where the two likeliest tokens are nearly tied the runs may part; they
/// must agree up to such a point, and the greedy run must be the argmax of its own logits at every
/// token.
#[test]
fn speculation_keeps_the_output_and_saves_steps_when_the_answer_copies_the_prompt() {
    let passage = "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of \
                   times, it was the age of wisdom, it was the age of foolishness, it was the epoch of belief.";
    let prompt =
        format!("<|im_start|>user\nRepeat this text word for word: {passage}<|im_end|>\n<|im_start|>assistant\n");
    let engine = private_engine(2);
    // Draft as deep as allowed whenever the text matches, whatever a token costs on this machine.
    engine.set_config(Some("smollm2"), "speculative_threshold", &serde_json::json!(0.0)).unwrap();
    let stats = |e: &EngineInstance| {
        let m = model_stats(e, "smollm2");
        let n = |k: &str| m[k].as_u64().unwrap();
        (n("decode_steps_total"), n("draft_tokens_total"), n("draft_accepted_total"))
    };
    /// Logprob gap under which batch-shape noise may swap the two likeliest tokens.
    const NEAR_TIE: f32 = 0.3;
    // Sampled answers stray from the passage sooner; some of their drafts must still be kept, so
    // that the path where a drawn token equals a draft token is taken under sampling too.
    let mut sampled_kept = 0;
    for (i, sampling) in [
        Sampling { max_tokens: Some(48), ..Sampling::greedy() },
        Sampling { max_tokens: Some(48), temperature: 0.7, seed: Some(7), ..Sampling::default() },
        Sampling { max_tokens: Some(48), temperature: 1.0, top_k: Some(40), seed: Some(3), ..Sampling::default() },
    ]
    .into_iter()
    .enumerate()
    {
        let sampling = Sampling { logprobs: Some(2), ..sampling };
        let off = Sampling { speculative: false, ..sampling.clone() };
        let before = stats(&engine);
        let (plain, plain_text, plain_gaps, _) =
            ids_on(&engine, &InferParams::new(100 + i as u64, "smollm2", &prompt, off));
        let between = stats(&engine);
        assert_eq!(between.1, before.1, "speculative: false drafts nothing");
        assert_eq!(between.0 - before.0, plain.len() as u64, "one step per token without drafts");
        let (fast, fast_text, fast_gaps, fast_argmax) =
            ids_on(&engine, &InferParams::new(200 + i as u64, "smollm2", &prompt, sampling.clone()));
        let after = stats(&engine);
        match plain.iter().zip(&fast).position(|(a, b)| a != b) {
            None => assert_eq!(fast.len(), plain.len(), "case {i}: {fast_text:?} vs {plain_text:?}"),
            Some(at) => assert!(
                at >= 16 && plain_gaps[at].min(fast_gaps[at]) < NEAR_TIE,
                "case {i}: parted at token {at} (gap {} / {}): {fast_text:?} vs {plain_text:?}",
                plain_gaps[at],
                fast_gaps[at]
            ),
        }
        if sampling.temperature == 0.0 {
            assert!(fast_argmax.iter().all(|&a| a), "case {i}: every greedy token is its logits' argmax");
        }
        let (steps, drafted, accepted) = (after.0 - between.0, after.1 - between.1, after.2 - between.2);
        assert!(accepted <= drafted, "case {i}: {accepted} of {drafted} drafts kept");
        if sampling.temperature > 0.0 {
            sampled_kept += accepted;
        }
        assert_eq!(steps + accepted, fast.len() as u64, "case {i}: each step gives one token plus the drafts it kept");
        if i == 0 {
            assert!(accepted > 0, "the greedy copy keeps drafts");
            assert!(plain_text.contains("best of times"), "the greedy answer copies the passage: {plain_text:?}");
            assert!(
                steps * 2 <= fast.len() as u64,
                "a copied answer takes at most half the steps: {steps} for {}",
                fast.len()
            );
        }
    }
    assert!(sampled_kept > 0, "no draft kept under sampling");
}

/// A prefix held by a busy slot serves a request that lands on the other slot: copied with the
/// whole stream between separate KV streams (each sequence attends over its own cells only), or
/// shared by reference in one unified cache (past the cell budget). Either way the answer is the
/// one a fresh instance gives.
#[test]
fn a_prefix_held_by_a_busy_slot_is_shared_with_the_other_slot() {
    let system = format!("<|im_start|>system\n{}<|im_end|>\n", "You answer briefly and precisely. ".repeat(20));
    let long = format!("{system}<|im_start|>user\nCount from one to two hundred.<|im_end|>\n<|im_start|>assistant\n");
    let short = format!("{system}<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n");
    let (fresh, _, _) = generate_on(
        &engine_with("fresh", InstanceConfig { slots: 1, ..Default::default() }),
        &greedy_on("fresh", 70, &short, 8),
    );
    // 2 x 2048 cells fit the budget: separate streams; 2 x 20000 do not: unified.
    for (ctx, separate) in [(2048, true), (20_000, false)] {
        let engine = engine_with("m", InstanceConfig { slots: 2, context_length: ctx, ..Default::default() });
        assert_eq!(model_stats(&engine, "m")["kv_separate_streams"], separate, "ctx {ctx}");
        let prefix = engine.tokenize("m", &system, true, true).unwrap().len() as u32;
        let (started, stop) = (std::sync::mpsc::channel::<()>(), std::sync::atomic::AtomicBool::new(false));
        let (text, res) = std::thread::scope(|s| {
            let busy = s.spawn(|| {
                let mut p = greedy_on("m", 71, &long, 2000);
                p.ignore_eos = true;
                let started = started.0.clone();
                engine.infer(&p, |_| {
                    let _ = started.send(());
                    !stop.load(std::sync::atomic::Ordering::Relaxed)
                })
            });
            started.1.recv().unwrap();
            let (text, _, res) = generate_on(&engine, &greedy_on("m", 72, &short, 8));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert_eq!(busy.join().unwrap().unwrap().finish_reason, FinishReason::Cancelled, "it was still running");
            (text, res)
        });
        assert!(res.cached_tokens >= prefix, "ctx {ctx}: cached {} of a {prefix}-token prefix", res.cached_tokens);
        assert_eq!(model_stats(&engine, "m")["prefix_copies_total"], 1, "ctx {ctx}");
        let head = |t: &str| t.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
        assert_eq!(head(&text), head(&fresh), "ctx {ctx}: shared {text:?} vs fresh {fresh:?}");
    }
}

#[test]
fn an_idle_cache_is_saved_to_host_memory_and_restored_for_its_prefix() {
    let system = format!("<|im_start|>system\n{}<|im_end|>\n", "You are a careful tutor of geography. ".repeat(12));
    let ask = |q: &str| format!("{system}<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n");
    let other = "<|im_start|>user\nCount from one to five.<|im_end|>\n<|im_start|>assistant\n";
    let prefix = private_engine(1).tokenize("smollm2", &system, true, true).unwrap().len() as u32;
    let engine = private_engine(2);
    let model_stats = |e: &EngineInstance| model_stats(e, "smollm2");

    generate_on(&engine, &greedy(60, &ask("What is the capital of Italy?"), 8));
    // A prompt sharing only the chat markup takes the slot that holds the long prompt (or the
    // other one, which moves the long prompt's cache out): either way the cache leaves the KV cache.
    generate_on(&engine, &greedy(61, other, 8));
    let after_other = model_stats(&engine);
    assert!(after_other["prefix_cache_saved_total"].as_u64() >= Some(1), "{after_other}");
    assert!(after_other["prefix_cache_bytes"].as_u64() > Some(0), "{after_other}");

    let question = ask("What is the capital of Spain?");
    let (text, _, res) = generate_on(&engine, &greedy(62, &question, 16));
    let stats = model_stats(&engine);
    assert_eq!(stats["prefix_cache_restored_total"].as_u64(), Some(1), "{stats}");
    assert!(res.cached_tokens >= prefix, "cached {} of a {prefix}-token prefix", res.cached_tokens);
    // The restored cells are the ones computed before: the answer matches a fresh instance's.
    let (fresh, _, fresh_res) = generate_on(&private_engine(1), &greedy(63, &question, 16));
    assert_eq!(fresh_res.cached_tokens, 0);
    let head = |t: &str| t.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
    assert_eq!(head(&text), head(&fresh), "restored {text:?} vs fresh {fresh:?}");

    // Budget 0 turns saving off and frees what was saved.
    engine.set_config(Some("smollm2"), "prefix_cache_mib", &serde_json::json!(0)).unwrap();
    generate_on(&engine, &greedy(64, other, 4));
    let off = model_stats(&engine);
    assert_eq!((off["prefix_cache_bytes"].as_u64(), off["prefix_cache_entries"].as_u64()), (Some(0), Some(0)), "{off}");
}

#[test]
fn a_dynamic_policy_keeps_idle_caches_at_int8_and_restores_them() {
    let system = format!("<|im_start|>system\n{}<|im_end|>\n", "You are a careful tutor of geography. ".repeat(12));
    let ask = |q: &str| format!("{system}<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n");
    let other = "<|im_start|>user\nCount from one to five.<|im_end|>\n<|im_start|>assistant\n";
    let question = ask("What is the capital of Spain?");
    // One slot: the second prompt takes it, so the first one's cache goes to host memory, and
    // the question finds its system prompt there.
    let run = |policy: Option<serde_json::Value>| {
        let engine = engine_with("idle", InstanceConfig { slots: 1, context_length: 1024, ..Default::default() });
        if let Some(p) = policy {
            engine.set_config(Some("idle"), "kv_policy", &p).unwrap();
        }
        generate_on(&engine, &greedy_on("idle", 1, &ask("What is the capital of Italy?"), 8));
        generate_on(&engine, &greedy_on("idle", 2, other, 8));
        let saved = model_stats(&engine, "idle");
        let (text, _, res) = generate_on(&engine, &greedy_on("idle", 3, &question, 16));
        (saved, text, res, model_stats(&engine, "idle"))
    };
    let (exact, exact_text, exact_res, exact_after) = run(None);
    let (int8, int8_text, int8_res, int8_after) = run(Some(serde_json::json!({"mode": "dynamic"})));
    assert_eq!(
        (exact["prefix_cache_saved_total"].as_u64(), exact["prefix_cache_int8_total"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(
        (int8["prefix_cache_saved_total"].as_u64(), int8["prefix_cache_int8_total"].as_u64()),
        (Some(1), Some(1))
    );
    // A byte per value and a scale per 32 instead of two bytes per value.
    let bytes = |s: &serde_json::Value| s["prefix_cache_bytes"].as_u64().unwrap() as f64;
    let ratio = bytes(&int8) / bytes(&exact);
    eprintln!("idle cache in host memory: f16 {} bytes, int8 {} bytes ({ratio:.3})", bytes(&exact), bytes(&int8));
    assert!((0.5..0.6).contains(&ratio), "{ratio}");
    // Both come back for the question's prefix, and give its answer.
    for (after, res) in [(&exact_after, &exact_res), (&int8_after, &int8_res)] {
        assert_eq!(after["prefix_cache_restored_total"].as_u64(), Some(1), "{after}");
        assert_eq!(res.cached_tokens, exact_res.cached_tokens);
    }
    assert!(exact_res.cached_tokens > 100, "{exact_res:?}");
    let head = |t: &str| t.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
    assert_eq!(head(&int8_text), head(&exact_text), "int8 {int8_text:?} vs f16 {exact_text:?}");
}

#[test]
fn a_sliding_window_model_keeps_its_idle_caches_at_int8_without_middle_eviction() {
    let hamlet = std::fs::read_to_string(model_path("corpus/hamlet_gut.txt")).unwrap();
    let words: Vec<&str> = hamlet.split_whitespace().collect();
    let passage = |from: usize, n: usize| words[from..from + n].join(" ");
    let turn = |user: &str| format!("<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n");
    let first = turn(&format!("{}\n\nWho speaks first in this passage?", passage(3000, 250)));
    let run = |policy: Option<serde_json::Value>| {
        let engine =
            EngineInstance::create(&plugin(), &InstanceConfig { slots: 1, context_length: 4096, ..Default::default() })
                .unwrap();
        let p = model_path("gemma-3-270m-q4_k_m.gguf");
        engine.load_model(&ModelSpec::new("g", Format::Gguf, p.display().to_string())).unwrap();
        if let Some(p) = policy {
            engine.set_config(Some("g"), "kv_policy", &p).unwrap();
        }
        let ask = |id: u64, prompt: &str| {
            let mut p = greedy_on("g", id, prompt, 12);
            p.sampling.speculative = false;
            generate_on(&engine, &p)
        };
        let (answer, _, _) = ask(1, &first);
        // Another prompt takes the slot: the conversation's cache goes to host memory.
        ask(2, &turn("Hi"));
        // The next turn goes on from the whole conversation: it comes back from there.
        let second = format!(
            "{first}{answer}<end_of_turn>\n{}",
            turn(&format!("{}\n\nAnd who speaks last?", passage(5000, 200)))
        );
        let (text, _, res) = ask(3, &second);
        (model_stats(&engine, "g"), text, res)
    };
    let (exact, exact_text, exact_res) = run(None);
    let (int8, int8_text, int8_res) = run(Some(serde_json::json!({"mode": "dynamic"})));
    // Gemma 3's sliding layers hold a window: llama.cpp cannot move its positions, so the policy
    // runs without middle eviction, and says so.
    assert_eq!((exact["kv_eviction"].is_null(), int8["kv_eviction"].is_null()), (true, true));
    // Both caches of the model (full and sliding layers) were saved at int8 and came back.
    assert_eq!(
        (exact["prefix_cache_int8_total"].as_u64(), int8["prefix_cache_int8_total"].as_u64()),
        (Some(0), Some(1))
    );
    for s in [&exact, &int8] {
        assert_eq!(s["prefix_cache_restored_total"].as_u64(), Some(1), "{s}");
    }
    assert_eq!(int8_res.cached_tokens, exact_res.cached_tokens);
    let bytes = |s: &serde_json::Value| s["prefix_cache_bytes"].as_u64().unwrap() as f64;
    eprintln!("Gemma 3 idle cache in host memory: f16 {} bytes, int8 {} bytes", bytes(&exact), bytes(&int8));
    assert!((0.5..0.6).contains(&(bytes(&int8) / bytes(&exact))), "{} / {}", bytes(&int8), bytes(&exact));
    let head = |t: &str| t.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
    assert_eq!(head(&int8_text), head(&exact_text), "int8 {int8_text:?} vs f16 {exact_text:?}");
}

#[test]
fn embeddings_of_similar_sentences_are_closer() {
    let inputs = ["The cat sits on the mat.", "A cat is sitting on a rug.", "Quarterly revenue grew by eight percent."];
    let mut vecs = vec![Vec::new(); 3];
    let tokens = engine()
        .embed(50, "minilm", &inputs, true, |i, v| {
            vecs[i] = v.to_vec();
            true
        })
        .unwrap();
    assert!(tokens > 10);
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    assert_eq!(vecs[0].len(), 384);
    let (similar, unrelated) = (dot(&vecs[0], &vecs[1]), dot(&vecs[0], &vecs[2]));
    eprintln!("cosine similar {similar:.3}, unrelated {unrelated:.3}");
    assert!(similar > unrelated + 0.2, "similar {similar} unrelated {unrelated}");
    let err = engine().infer(&InferParams::greedy(51, "minilm", "hello"), |_| true).unwrap_err();
    assert_eq!(err.status, EngineStatus::Unsupported);
}

#[test]
fn a_corrupt_or_foreign_file_is_refused_with_the_right_code_and_no_crash() {
    let dir = tempfile_dir();
    let real = std::fs::read(model_path("smollm2-135m-instruct-q4_1.gguf")).unwrap();
    let cases: Vec<(&str, Vec<u8>, EngineStatus)> = vec![
        ("truncated-tensors.gguf", real[..real.len() / 2].to_vec(), EngineStatus::ModelCorrupt),
        ("truncated-header.gguf", real[..4096].to_vec(), EngineStatus::ModelCorrupt),
        ("not-gguf.gguf", b"PK\x03\x04 this is a zip, not a model".to_vec(), EngineStatus::LoadFailed),
        ("empty.gguf", Vec::new(), EngineStatus::LoadFailed),
    ];
    for (name, bytes, want) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let err = engine().load_model(&ModelSpec::new(name, Format::Gguf, path.display().to_string())).unwrap_err();
        assert_eq!(err.status, want, "{name}: {}", err.message);
        assert!(err.message.contains(name), "{name}: {}", err.message);
    }
    // The instance is unharmed.
    assert!(generate(&greedy(60, CHAT, 4)).2.completion_tokens > 0);
}

/// An instance with SmolLM2 loaded as `id` (the scheduler thread is named after it).
fn engine_with(id: &str, config: InstanceConfig) -> EngineInstance {
    let engine = EngineInstance::create(&plugin(), &config).unwrap();
    let p = model_path("smollm2-135m-instruct-q4_1.gguf");
    engine.load_model(&ModelSpec::new(id, Format::Gguf, p.display().to_string())).unwrap();
    engine
}

#[test]
fn the_kv_cache_type_changes_the_live_context() {
    let engine = engine_with("kv", InstanceConfig { slots: 1, context_length: 1024, ..Default::default() });
    // A prompt, then another that takes its slot: the first one's cache is saved to host memory,
    // in the context's own format, so its size is that of the live KV cache.
    let saved_cache = |id: u64| {
        let mut p = InferParams::greedy(id, "kv", CHAT);
        (p.sampling.max_tokens, p.ignore_eos) = (Some(16), true);
        let (text, _, res) = generate_on(&engine, &p);
        assert_eq!(res.completion_tokens, 16);
        generate_on(&engine, &greedy_on("kv", id + 1, "Hello", 1));
        let stats = model_stats(&engine, "kv");
        assert_eq!(stats["prefix_cache_entries"].as_u64(), Some(1), "{stats}");
        (text, stats["prefix_cache_bytes"].as_u64().unwrap())
    };
    let (f16_text, f16_bytes) = saved_cache(1);
    engine.set_config(Some("kv"), "kv_cache_type", &serde_json::json!("q8_0")).unwrap();
    let info = engine.model_info("kv").unwrap();
    assert_eq!(info.extra["kv_cache_type"], "q8_0");
    let (q8_text, q8_bytes) = saved_cache(3);
    // q8_0 stores 32 values in 34 bytes, f16 in 64: the same cells take about half the memory.
    let ratio = q8_bytes as f64 / f16_bytes as f64;
    eprintln!("saved cache: f16 {f16_bytes} bytes, q8_0 {q8_bytes} bytes ({ratio:.3})");
    assert!((0.45..0.65).contains(&ratio), "q8_0 {q8_bytes} bytes, f16 {f16_bytes} bytes");
    // And they change SmolLM2-135M's greedy answer (measured: from its first token).
    assert_ne!(q8_text, f16_text, "the same answer with q8_0 keys and values");
    // Back to f16: the same context as at first, the same cache size and answer.
    engine.set_config(Some("kv"), "kv_cache_type", &serde_json::json!("f16")).unwrap();
    assert_eq!(saved_cache(5), (f16_text, f16_bytes));

    let err = engine.set_config(Some("kv"), "kv_cache_type", &serde_json::json!("q3")).unwrap_err();
    assert_eq!(err.status, EngineStatus::Unsupported);
    assert!(err.message.contains("kv_cache_type"), "{}", err.message);

    // The staged cache's policy API (spec 002): a static int8 level is q8_0 here, the same cache
    // and answer as above; dynamic levels are refused, naming the engine that has them.
    engine.set_config(Some("kv"), "kv_policy", &serde_json::json!({"mode": "static", "static_level": "int8"})).unwrap();
    assert_eq!(engine.model_info("kv").unwrap().extra["kv_cache_type"], "q8_0");
    assert_eq!(saved_cache(7), (q8_text, q8_bytes));
    let levels = &model_stats(&engine, "kv")["kv_levels"];
    assert_eq!((levels["L0"].as_u64(), levels["L3"].as_u64()), (Some(0), Some(0)), "{levels}");
    // Dynamic levels keep the cache's type and evict middle chunks (the next test).
    engine.set_config(Some("kv"), "kv_policy", &serde_json::json!({"mode": "dynamic"})).unwrap();
    assert_eq!(engine.model_info("kv").unwrap().extra["kv_cache_type"], "q8_0");
    let eviction = &model_stats(&engine, "kv")["kv_eviction"];
    assert_eq!(*eviction, serde_json::json!({"sink_tokens": 16, "recent_window": 64}));
    let err = engine
        .set_config(Some("kv"), "kv_policy", &serde_json::json!({"mode": "static", "recent_window": 4}))
        .unwrap_err();
    assert_eq!(err.status, EngineStatus::Unsupported);
    assert!(err.message.contains("recent_window"), "{}", err.message);
    assert_eq!(engine.model_info("kv").unwrap().extra["kv_cache_type"], "q8_0", "a refused policy changes nothing");
    assert_eq!(model_stats(&engine, "kv")["kv_eviction"], *eviction, "a refused policy changes nothing");
}

/// Greedy token ids of `params` on `engine`, and the request's result.
fn token_ids(engine: &EngineInstance, params: &InferParams<'_>) -> (Vec<i32>, llmr_engine_host::InferResult) {
    let mut ids = Vec::new();
    let res = engine
        .infer(params, |t| {
            ids.push(t.token_id);
            true
        })
        .unwrap();
    (ids, res)
}

#[test]
fn a_dynamic_policy_evicts_middle_chunks_so_generation_outlives_the_context() {
    const CTX: u32 = 128;
    let config = || InstanceConfig { slots: 1, context_length: CTX, ..Default::default() };
    let long = |id: u64, model: &'static str| {
        let mut p = InferParams::greedy(id, model, CHAT);
        (p.sampling.max_tokens, p.ignore_eos) = (Some(300), true);
        p
    };
    // Without a policy the sequence ends where its context does.
    let plain = engine_with("plain", config());
    let (plain_ids, res) = token_ids(&plain, &long(1, "plain"));
    assert_eq!(res.finish_reason, FinishReason::Length);
    assert!(res.prompt_tokens + res.completion_tokens <= CTX, "{res:?}");

    let shift = engine_with("shift", config());
    let policy = serde_json::json!({"mode": "dynamic", "recent_window": 32, "sink_tokens": 16});
    shift.set_config(Some("shift"), "kv_policy", &policy).unwrap();
    let mut mid_run = None;
    let mut ids = Vec::new();
    let res = shift
        .infer(&long(2, "shift"), |t| {
            ids.push(t.token_id);
            if ids.len() == 250 {
                mid_run = Some(model_stats(&shift, "shift"));
            }
            true
        })
        .unwrap();
    // It generates all it was asked for, well past the context.
    assert_eq!((res.finish_reason, res.completion_tokens), (FinishReason::Length, 300), "{res:?}");
    // Up to where the plain run stopped, both computed the same thing: the same tokens.
    assert_eq!(ids[..plain_ids.len()], plain_ids[..]);
    let stats = mid_run.unwrap();
    let (evicted, cells) = (stats["kv_levels"]["L3"].as_u64().unwrap(), stats["kv_cells_used"].as_u64().unwrap());
    assert!(evicted > 0 && cells < u64::from(CTX), "{stats}");
    // Each shift drops half of the middle: never the 16 sinks or the last 32 positions.
    let shifts = model_stats(&shift, "shift")["kv_shifts_total"].as_u64().unwrap();
    let total = model_stats(&shift, "shift")["kv_evicted_total"].as_u64().unwrap();
    let positions = u64::from(res.prompt_tokens + res.completion_tokens);
    eprintln!("{shifts} shifts dropped {total} of {positions} positions; {evicted} evicted at token 250");
    assert!(
        shifts >= 2 && total + u64::from(CTX) >= positions && total <= shifts * u64::from(CTX - 48),
        "{shifts} {total}"
    );
    assert_eq!(model_stats(&shift, "shift")["kv_levels"]["L3"], 0, "nothing runs");

    // What moved over the gap is no one's prefix: the same prompt again reuses the sinks alone,
    // and answers as a fresh cache does.
    let (again, res) = token_ids(&shift, &long(3, "shift"));
    assert_eq!(res.cached_tokens, 16, "{res:?}");
    assert_eq!(again[..8], plain_ids[..8]);
}

/// CPU clock ticks used so far by each thread of this process named `name` (threads inherit the
/// name of the thread that starts them, so llama.cpp's workers carry the scheduler's).
#[cfg(target_os = "linux")]
fn thread_ticks(name: &str) -> std::collections::HashMap<u32, u64> {
    let mut out = std::collections::HashMap::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        if &stat[open + 1..close] != name {
            continue;
        }
        // After the name: state is field 3, utime and stime are fields 14 and 15.
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        out.insert(task.file_name().to_str().unwrap().parse().unwrap(), ticks);
    }
    out
}

/// How many threads named `name` used CPU time while `f` ran.
#[cfg(target_os = "linux")]
fn threads_busy_during(name: &str, f: impl FnOnce()) -> usize {
    let before = thread_ticks(name);
    f();
    let after = thread_ticks(name);
    after.iter().filter(|(tid, t)| **t > before.get(tid).copied().unwrap_or(0)).count()
}

#[cfg(target_os = "linux")]
#[test]
fn the_thread_count_changes_the_threads_that_compute() {
    // The scheduler thread of model "thr" is "llmr-sched-thr"; llama.cpp's workers inherit it.
    let engine =
        engine_with("thr", InstanceConfig { slots: 1, context_length: 1024, threads: 2, ..Default::default() });
    assert_eq!(engine.model_info("thr").unwrap().extra["threads"], 2);
    let run = |id: u64| {
        let mut p = InferParams::greedy(id, "thr", CHAT);
        (p.sampling.max_tokens, p.ignore_eos) = (Some(64), true);
        assert_eq!(generate_on(&engine, &p).2.completion_tokens, 64);
    };
    run(1); // the worker pool starts
    let two = threads_busy_during("llmr-sched-thr", || run(2));
    eprintln!("threads = 2: {two} threads computed");
    assert!(two >= 2, "{two} threads computed with threads = 2");
    engine.set_config(Some("thr"), "threads", &serde_json::json!(1)).unwrap();
    run(3); // the context is rebuilt with one thread; the pool's workers go to sleep
    let one = threads_busy_during("llmr-sched-thr", || run(4));
    eprintln!("threads = 1: {one} threads computed");
    assert_eq!(one, 1, "only the scheduler thread computes with threads = 1");
    engine.set_config(Some("thr"), "threads", &serde_json::json!(2)).unwrap();
    run(5);
    let two = threads_busy_during("llmr-sched-thr", || run(6));
    assert!(two >= 2, "{two} threads computed with threads = 2 again");
    let err = engine.set_config(Some("thr"), "threads", &serde_json::json!(0)).unwrap_err();
    assert_eq!(err.status, EngineStatus::Unsupported);
}

#[test]
fn prefill_chunk_sets_how_many_prompt_tokens_a_step_reads() {
    let engine = engine_with("chunk", InstanceConfig { slots: 1, context_length: 1024, ..Default::default() });
    // Prompts of the same length that share no prefix (so nothing cached is reused), one token each.
    let prompt = |word: &str| format!("{word} ").repeat(60);
    let mut steps = Vec::new();
    for (i, chunk) in [256u32, 7, 32].into_iter().enumerate() {
        if i > 0 {
            engine.set_config(Some("chunk"), "prefill_chunk", &serde_json::json!(chunk)).unwrap();
        }
        let before = decode_steps(&engine, "chunk");
        let text = prompt(["red", "blue", "green"][i]);
        let params = greedy_on("chunk", 10 + i as u64, &text, 1);
        let (_, _, res) = generate_on(&engine, &params);
        let taken = decode_steps(&engine, "chunk") - before;
        assert!(res.prompt_tokens >= 60 && res.cached_tokens <= 1, "{res:?}");
        assert_eq!(taken, steps_alone(&res, chunk), "chunk {chunk}: {res:?}");
        steps.push(taken);
    }
    assert_eq!(steps[0], 1, "the default chunk (256) reads the whole prompt in one step");
    assert!(steps[1] > steps[2] && steps[2] > steps[0], "{steps:?}");
}

#[test]
fn slots_bound_how_many_sequences_run_at_once() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    for slots in [1u32, 2] {
        let id = format!("slots{slots}");
        let engine = engine_with(&id, InstanceConfig { slots, context_length: 1024, ..Default::default() });
        let stop = AtomicBool::new(false);
        let tokens = [AtomicU32::new(0), AtomicU32::new(0)];
        std::thread::scope(|s| {
            for (i, count) in tokens.iter().enumerate() {
                let (engine, stop, id) = (&engine, &stop, &id);
                s.spawn(move || {
                    let mut p = InferParams::greedy(i as u64, id, "Count from one to one thousand:");
                    (p.sampling.max_tokens, p.ignore_eos) = (Some(900), true);
                    engine.infer(&p, |_| {
                        count.fetch_add(1, Ordering::SeqCst);
                        !stop.load(Ordering::SeqCst)
                    })
                });
            }
            // Both requests reach the scheduler and `slots` of them generate, the others wait: the
            // metrics and the tokens each request received agree (an engine admitting more than
            // its slots never gets there).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            loop {
                let stats = model_stats(&engine, &id);
                let counts = tokens.each_ref().map(|c| c.load(Ordering::SeqCst));
                let running = counts.iter().filter(|&&n| n > 0).count() as u64;
                let expected = (Some(2), Some(u64::from(slots)), Some(u64::from(2 - slots)), u64::from(slots));
                let seen =
                    (stats["requests_total"].as_u64(), stats["slots_busy"].as_u64(), stats["queued"].as_u64(), running);
                if seen == expected && counts.iter().any(|&n| n >= 10) {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    stop.store(true, Ordering::SeqCst);
                    panic!("slots {slots}: (requests, busy, queued, generating) {seen:?}, tokens {counts:?}: {stats}");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmr-llama-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A bounded schema, so that every draw can end well within its token budget.
const PERSON: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"enum": ["Paris", "Berlin", "Rome", "Madrid"]}},
  "required": ["name", "age", "city"], "additionalProperties": false}"#;

#[test]
fn constrained_answers_follow_their_schema_greedy_and_sampled() {
    let ask = "<|im_start|>user\nDescribe a person who lives in a European capital, as JSON.<|im_end|>\n<|im_start|>assistant\n";
    let schema = || Some(llmr_engine_host::Constraint::JsonSchema(PERSON.into()));
    let settings = [
        Sampling { max_tokens: Some(120), constraint: schema(), ..Sampling::greedy() },
        // Penalties and top-k: the settings llama.cpp's own chain would otherwise take.
        Sampling {
            max_tokens: Some(120),
            temperature: 1.5,
            top_k: Some(40),
            repeat_penalty: 1.1,
            seed: Some(1),
            constraint: schema(),
            ..Sampling::default()
        },
        Sampling {
            max_tokens: Some(120),
            temperature: 1.5,
            seed: Some(2),
            constraint: schema(),
            ..Sampling::default()
        },
        Sampling {
            max_tokens: Some(120),
            temperature: 1.5,
            seed: Some(3),
            constraint: schema(),
            ..Sampling::default()
        },
    ];
    for (i, s) in settings.into_iter().enumerate() {
        let (text, _, res) = generate(&InferParams::new(900 + i as u64, "smollm2", ask, s));
        assert_eq!(res.finish_reason, FinishReason::Stop, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 3, "{text}");
        assert!(o["name"].as_str().is_some_and(|n| n.chars().count() <= 24), "{text}");
        assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
        assert!(["Paris", "Berlin", "Rome", "Madrid"].contains(&o["city"].as_str().unwrap_or_default()), "{text}");
    }
    let yes_no = Sampling {
        max_tokens: Some(8),
        constraint: Some(llmr_engine_host::Constraint::Regex("(yes|no)".into())),
        ..Sampling::greedy()
    };
    let prompt =
        "<|im_start|>user\nIs Paris the capital of France? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n";
    let (text, _, res) = generate(&InferParams::new(910, "smollm2", prompt, yes_no));
    assert!((text == "yes" || text == "no") && res.finish_reason == FinishReason::Stop, "{text:?}");
    let bad = Sampling {
        constraint: Some(llmr_engine_host::Constraint::Lark("start: missing_rule".into())),
        ..Sampling::greedy()
    };
    let err = engine().infer(&InferParams::new(911, "smollm2", prompt, bad), |_| true).unwrap_err();
    assert_eq!(err.status, EngineStatus::Unsupported, "{}", err.message);
    assert!(err.message.contains("missing_rule"), "{}", err.message);
}

#[test]
fn prompts_and_embedding_inputs_given_as_token_ids_read_as_their_text_does() {
    // Its own instance: llama.cpp's numerics depend on what shares a batch.
    let e = private_engine(2);
    let ids = e.tokenize("smollm2", CHAT, true, true).unwrap();
    let (from_text, _, _) = generate_on(&e, &greedy(920, CHAT, 12));
    let mut p = greedy(921, "", 12);
    p.prompt_tokens = Some(&ids);
    let (from_ids, _, res) = generate_on(&e, &p);
    assert_eq!((from_ids.as_str(), res.prompt_tokens as usize), (from_text.as_str(), ids.len()));
    let outside = [ids[0], -1];
    p.prompt_tokens = Some(&outside);
    let err = e.infer(&p, |_| true).unwrap_err();
    assert_eq!(err.status, EngineStatus::Unsupported);
    assert!(err.message.contains("prompt_tokens[1]"), "{}", err.message);

    let text = "The capital of France is Paris.";
    let ids = e.tokenize("minilm", text, true, false).unwrap();
    let mut by_text = Vec::new();
    e.embed(922, "minilm", &[text], true, |_, v| {
        by_text = v.to_vec();
        true
    })
    .unwrap();
    let mut by_ids = Vec::new();
    let counted = e
        .embed_inputs(923, "minilm", llmr_engine_host::EmbedInputs::Tokens(&[&ids]), true, |_, v| {
            by_ids = v.to_vec();
            true
        })
        .unwrap();
    assert_eq!(counted as usize, ids.len());
    assert_eq!(by_text, by_ids, "the same tokens, the same vector");
}

/// Gemma 3 (sliding-window layers of 512 tokens) on a window-sized cache, llama.cpp's `swa_full`
/// off: a follow-up turn goes on from the live cache; a prompt that parts from the cache further
/// back than the window still holds resumes from the checkpoint taken where an earlier prompt
/// ended, or, with checkpoints off, is read again from the start. Every answer is the one a
/// fresh instance gives the same prompt, and the cache is several times smaller than a
/// full-size one.
#[test]
fn a_sliding_window_cache_resumes_from_its_window_or_a_checkpoint() {
    let hamlet = std::fs::read_to_string(model_path("corpus/hamlet_gut.txt")).unwrap();
    let words: Vec<&str> = hamlet.split_whitespace().collect();
    let passage = |from: usize, n: usize| words[from..from + n].join(" ");
    let turn = |user: &str| format!("<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n");
    let gemma = |config: InstanceConfig| {
        let engine = EngineInstance::create(&plugin(), &config).unwrap();
        let p = model_path("gemma-3-270m-q4_k_m.gguf");
        engine.load_model(&ModelSpec::new("g", Format::Gguf, p.display().to_string())).unwrap();
        engine
    };
    let config = InstanceConfig { slots: 1, context_length: 8192, ..Default::default() };
    let ask = |engine: &EngineInstance, id: u64, prompt: &str| {
        let mut p = greedy_on("g", id, prompt, 12);
        p.sampling.speculative = false;
        generate_on(engine, &p)
    };
    let head = |t: &str| t.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
    let fresh = |prompt: &str| ask(&gemma(config.clone()), 1, prompt).0;

    let engine = gemma(config.clone());
    let stats = || model_stats(&engine, "g");
    assert_eq!(stats()["kv_swa_full"], false);
    // Turn 1: ~350 tokens of Hamlet and a question.
    let first = turn(&format!("{}\n\nWho speaks first in this passage?", passage(3000, 250)));
    let (answer, _, _) = ask(&engine, 2, &first);
    let first_len = engine.tokenize("g", &first, true, true).unwrap().len() as u32;
    assert_eq!(stats()["ctx_checkpoints_saved_total"], 1, "{}", stats());

    // Turn 2 goes on from the whole conversation, with another ~1,400 tokens of text: the cache
    // ends where the conversation does, so the window there is held.
    let second =
        format!("{first}{answer}<end_of_turn>\n{}", turn(&format!("{}\n\nAnd who speaks last?", passage(5000, 1000))));
    let (text, _, res) = ask(&engine, 3, &second);
    assert!(res.cached_tokens > first_len, "cached {} of a {first_len}-token first turn", res.cached_tokens);
    assert_eq!(head(&text), head(&fresh(&second)), "turn 2");
    assert_eq!(
        (stats()["ctx_checkpoints_restored_total"].as_u64(), stats()["window_reprocessed_total"].as_u64()),
        (Some(0), Some(0))
    );

    // A prompt that keeps turn 1 and drops turn 2 parts from the cache ~650 tokens before its
    // end, further back than the window (512) and the batch of slack it holds: it resumes from
    // turn 1's checkpoint.
    let other = format!("{first}{answer}<end_of_turn>\n{}", turn("Summarise it in one line."));
    let (text, _, res) = ask(&engine, 4, &other);
    assert_eq!(stats()["ctx_checkpoints_restored_total"], 1, "{}", stats());
    assert!(res.cached_tokens >= first_len, "resumed at {} of {first_len}", res.cached_tokens);
    assert_eq!(head(&text), head(&fresh(&other)), "after a checkpoint");

    // With checkpoints off, the same cut reads the prompt again from the start (the saved copies
    // of these caches in host memory hold only the window before their ends, which neither
    // prompt goes on from).
    engine.set_config(Some("g"), "ctx_checkpoints", &serde_json::json!(0)).unwrap();
    ask(&engine, 5, &second);
    let reprocessed = stats()["window_reprocessed_total"].as_u64().unwrap();
    let (text, _, res) = ask(&engine, 6, &other);
    assert_eq!(res.cached_tokens, 0);
    assert_eq!(stats()["window_reprocessed_total"].as_u64(), Some(reprocessed + 1), "{}", stats());
    assert_eq!(head(&text), head(&fresh(&other)), "read again");

    // The window-sized cache against a full-size one, as llama.cpp allocated them.
    let window_bytes = stats()["kv_bytes"].as_u64().unwrap();
    let full = gemma(config.clone());
    full.set_config(Some("g"), "swa_full", &serde_json::json!(true)).unwrap();
    ask(&full, 7, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    let full_bytes = model_stats(&full, "g")["kv_bytes"].as_u64().unwrap();
    eprintln!("Gemma 3 KV cache at 8192 tokens: window-sized {window_bytes} bytes, full-size {full_bytes} bytes");
    assert!(window_bytes > 0 && full_bytes > 3 * window_bytes, "window {window_bytes}, full {full_bytes}");
}

/// Speculation on a sliding-window cache (Gemma 3, window 512, `swa_full` off): a copying answer
/// past position 512 drafts, and rejected drafts leave the cache (`seq_rm`) after the window
/// has moved over them. The greedy answer is the one speculation off gives, token for token, up
/// to a near tie of batch-shape noise, and drafts are kept.
#[test]
fn speculation_on_a_sliding_window_cache_keeps_the_greedy_answer() {
    let hamlet = std::fs::read_to_string(model_path("corpus/hamlet_gut.txt")).unwrap();
    let words: Vec<&str> = hamlet.split_whitespace().collect();
    let passage = words[8000..8450].join(" ");
    let prompt = format!(
        "<start_of_turn>user\n{passage}\n\nRepeat the first lines of this text word for word.<end_of_turn>\n<start_of_turn>model\n"
    );
    let engine =
        EngineInstance::create(&plugin(), &InstanceConfig { slots: 1, context_length: 4096, ..Default::default() })
            .unwrap();
    let p = model_path("gemma-3-270m-q4_k_m.gguf");
    engine.load_model(&ModelSpec::new("g", Format::Gguf, p.display().to_string())).unwrap();
    assert_eq!(model_stats(&engine, "g")["kv_swa_full"], false);
    let prompt_len = engine.tokenize("g", &prompt, true, true).unwrap().len();
    assert!(prompt_len > 600, "past the 512-token window: {prompt_len}");
    engine.set_config(Some("g"), "speculative_threshold", &serde_json::json!(0.0)).unwrap();
    let sampling = Sampling { max_tokens: Some(64), logprobs: Some(2), ..Sampling::greedy() };
    let off = Sampling { speculative: false, ..sampling.clone() };
    let (plain, plain_text, plain_gaps, _) = ids_on(&engine, &InferParams::new(1, "g", &prompt, off));
    let drafts = |e: &EngineInstance| {
        let m = model_stats(e, "g");
        (m["draft_tokens_total"].as_u64().unwrap(), m["draft_accepted_total"].as_u64().unwrap())
    };
    let before = drafts(&engine);
    let (fast, fast_text, fast_gaps, fast_argmax) = ids_on(&engine, &InferParams::new(2, "g", &prompt, sampling));
    let (drafted, accepted) = (drafts(&engine).0 - before.0, drafts(&engine).1 - before.1);
    eprintln!("{accepted} of {drafted} drafts kept; {fast_text:?}");
    assert!(accepted > 0 && accepted < drafted, "drafts kept and drafts rolled back: {accepted} of {drafted}");
    assert!(fast_argmax.iter().all(|&a| a), "every greedy token is its logits' argmax");
    match plain.iter().zip(&fast).position(|(a, b)| a != b) {
        None => assert_eq!(fast.len(), plain.len(), "{fast_text:?} vs {plain_text:?}"),
        Some(at) => assert!(
            at >= 16 && plain_gaps[at].min(fast_gaps[at]) < 0.3,
            "parted at token {at} (gap {} / {}): {fast_text:?} vs {plain_text:?}",
            plain_gaps[at],
            fast_gaps[at]
        ),
    }
}

/// Between separate KV streams llama.cpp decodes each run of consecutive sequence ids as a
/// forward pass of its own, so a request joins the slot that keeps the running ones together,
/// not the one holding its longest prefix or the least recently used: here that slot is two away
/// from the running one, and the two sequences still decode in one forward pass a step.
#[test]
fn running_sequences_are_kept_on_consecutive_slots() {
    let engine = engine_with("c", InstanceConfig { slots: 4, context_length: 2048, ..Default::default() });
    assert_eq!(model_stats(&engine, "c")["kv_separate_streams"], true);
    // Four unrelated prompts one after another take the four slots, the last one first: slot 3
    // is now the least recently used, and slot 1 holds the third prompt.
    let warm = [
        "Alpha: the river bends twice before the sea.",
        "Beta: a quiet morning in the old market square.",
        "Gamma: the committee met on Tuesday to discuss the new library budget and its schedule.",
        "Delta: snow fell on the northern pass all night.",
    ];
    // (No BOS: prompts that share nothing keep a slot's cache from looking like a prefix.)
    for (i, q) in warm.iter().enumerate() {
        let p = InferParams { add_bos: false, ..greedy_on("c", 80 + i as u64, q, 2) };
        generate_on(&engine, &p);
    }
    let counters = || {
        let s = model_stats(&engine, "c");
        (s["decode_steps_total"].as_u64().unwrap(), s["stream_runs_total"].as_u64().unwrap_or(0))
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let long = |id: u64, prompt: String, started: std::sync::mpsc::Sender<()>| {
        let mut p = greedy_on("c", id, &prompt, 1500);
        (p.ignore_eos, p.add_bos) = (true, false);
        p.sampling.speculative = false;
        engine.infer(&p, |_| {
            let _ = started.send(());
            !stop.load(std::sync::atomic::Ordering::Relaxed)
        })
    };
    std::thread::scope(|s| {
        // The first long request takes the least recently used slot (3); the second shares the
        // third prompt, held by slot 1, but joins slot 2.
        let (first, first_rx) = std::sync::mpsc::channel();
        let a = s.spawn(|| long(90, "Count from one to five hundred, slowly:".into(), first));
        first_rx.recv().unwrap();
        let (second, second_rx) = std::sync::mpsc::channel();
        let b = s.spawn(|| long(91, format!("{} Then list every member who spoke:", warm[2]), second));
        second_rx.recv().unwrap();
        let ((steps0, runs0), t0) = (counters(), std::time::Instant::now());
        while counters().0 < steps0 + 40 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let ((steps1, runs1), t1) = (counters(), std::time::Instant::now());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        a.join().unwrap().unwrap();
        b.join().unwrap().unwrap();
        let ms = (t1 - t0).as_secs_f64() * 1e3 / (steps1 - steps0) as f64;
        eprintln!("two sequences: {ms:.2} ms a step, {} runs in {} steps", runs1 - runs0, steps1 - steps0);
        assert_eq!(runs1 - runs0, steps1 - steps0, "forward passes per step while both run");
    });
}

/// One unified cache of fewer cells than three sequences need (`kv_cells`): when the cells run
/// out, the sequence that started last is preempted (its cache saved to host memory) and comes
/// back once the others leave room, its cache restored. Every answer comes whole and on its
/// topic, and nothing is left behind. (llama.cpp is not batch-invariant: the same greedy
/// request may read differently beside other sequences, so the answers are not compared with a
/// roomier run's word for word.)
#[test]
fn a_full_unified_cache_preempts_the_newest_sequence_and_every_answer_comes_whole() {
    const MAX: u32 = 200;
    let load = |id: &str, cells: u32| {
        let engine =
            EngineInstance::create(&plugin(), &InstanceConfig { slots: 3, context_length: 512, ..Default::default() })
                .unwrap();
        let mut spec =
            ModelSpec::new(id, Format::Gguf, model_path("smollm2-135m-instruct-q4_1.gguf").display().to_string());
        spec.options = Some(serde_json::json!({ "kv_cells": cells }));
        engine.load_model(&spec).unwrap();
        engine
    };
    let topics = ["the history of the printing press", "how bridges carry their load", "the life cycle of stars"];
    let keywords = ["print", "bridge", "star"];
    let prompts: Vec<String> = topics
        .iter()
        .map(|t| {
            let context = format!("Write a long and detailed essay about {t}. ").repeat(16);
            format!("<|im_start|>user\n{context}<|im_end|>\n<|im_start|>assistant\n")
        })
        .collect();
    let serve = |engine: &EngineInstance, id: &str| -> Vec<(String, llmr_engine_host::InferResult)> {
        std::thread::scope(|s| {
            let handles: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    s.spawn(move || {
                        let mut params = greedy_on(id, 900 + i as u64, p, MAX);
                        params.ignore_eos = true;
                        let (text, _, res) = generate_on(engine, &params);
                        (text, res)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    // 1,200 cells hold the three (~170 prompt tokens + 200 each); 512 (one context) do not.
    let roomy_engine = load("roomy", 1200);
    let roomy = serve(&roomy_engine, "roomy");
    assert_eq!(model_stats(&roomy_engine, "roomy")["preemptions_total"], 0);
    let engine = load("tight", 512);
    let stats = model_stats(&engine, "tight");
    assert_eq!((stats["kv_cells_total"].as_u64(), stats["kv_separate_streams"].as_bool()), (Some(512), Some(false)));
    let tight = serve(&engine, "tight");
    let stats = model_stats(&engine, "tight");
    eprintln!("{stats}");
    assert!(tight.iter().all(|(_, r)| r.prompt_tokens > 150), "{tight:?}");
    assert!(stats["preemptions_total"].as_u64() > Some(0), "{stats}");
    assert!(stats["prefix_cache_restored_total"].as_u64() > Some(0), "a preempted cache came back: {stats}");
    for (((text, res), (_, roomy_res)), keyword) in tight.iter().zip(&roomy).zip(keywords) {
        assert_eq!((res.finish_reason, res.completion_tokens), (FinishReason::Length, MAX), "{tight:?}");
        assert_eq!(res.prompt_tokens, roomy_res.prompt_tokens);
        assert!(text.to_lowercase().contains(keyword), "{keyword}: {text:?}");
    }
    assert_eq!((stats["slots_busy"].as_u64(), stats["queued"].as_u64()), (Some(0), Some(0)), "{stats}");
    // A bad cell budget is refused at load, naming the option.
    let engine = EngineInstance::create(&plugin(), &InstanceConfig::default()).unwrap();
    let mut spec =
        ModelSpec::new("bad", Format::Gguf, model_path("smollm2-135m-instruct-q4_1.gguf").display().to_string());
    spec.options = Some(serde_json::json!({ "kv_cells": -3 }));
    let e = engine.load_model(&spec).unwrap_err();
    assert!(e.to_string().contains("`kv_cells`"), "{e}");
}
