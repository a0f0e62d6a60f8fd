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
use std::time::Instant;

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
    let mut p = InferParams::greedy(id, "smollm2", prompt);
    p.sampling.max_tokens = Some(max);
    p
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
fn cancel_mid_generation_frees_the_slot_and_the_next_request_runs_at_full_speed() {
    let engine = private_engine(2);
    let prompt = "List the numbers from one to one hundred in words:";
    let start = Instant::now();
    let (_, _, baseline) = generate_on(&engine, &greedy(30, prompt, 48));
    let baseline_tps = baseline.completion_tokens as f64 / start.elapsed().as_secs_f64();

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

    let metrics = engine.metrics().unwrap();
    let busy = metrics["slots_busy"].as_u64().unwrap();
    assert_eq!(busy, 0, "slot released: {metrics}");
    let start = Instant::now();
    let (_, _, after) = generate_on(&engine, &greedy(32, prompt, 48));
    let after_tps = after.completion_tokens as f64 / start.elapsed().as_secs_f64();
    eprintln!("tokens/s before {baseline_tps:.1}, after cancel {after_tps:.1}");
    assert!(after_tps > baseline_tps * 0.5, "after cancel {after_tps:.1} tok/s vs {baseline_tps:.1}");
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

#[test]
fn a_repeated_prefix_is_served_from_the_cache() {
    let system = format!("<|im_start|>system\n{}<|im_end|>\n", "You answer briefly and precisely. ".repeat(20));
    let first = format!("{system}<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
    let second = format!("{system}<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n");
    let engine = private_engine(2);
    let (_, _, a) = generate_on(&engine, &greedy(40, &first, 8));
    let (_, _, b) = generate_on(&engine, &greedy(41, &second, 8));
    let prefix = engine.tokenize("smollm2", &system, true, true).unwrap().len() as u32;
    assert!(b.cached_tokens >= prefix, "cached {} of a {prefix}-token prefix", b.cached_tokens);
    assert!(b.prompt_eval_ns < a.prompt_eval_ns, "prefix reuse should make the prompt faster");
}

#[test]
fn an_idle_cache_is_saved_to_host_memory_and_restored_for_its_prefix() {
    let system = format!("<|im_start|>system\n{}<|im_end|>\n", "You are a careful tutor of geography. ".repeat(12));
    let ask = |q: &str| format!("{system}<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n");
    let other = "<|im_start|>user\nCount from one to five.<|im_end|>\n<|im_start|>assistant\n";
    let prefix = private_engine(1).tokenize("smollm2", &system, true, true).unwrap().len() as u32;
    let engine = private_engine(2);
    let model_stats = |e: &EngineInstance| {
        let all = e.metrics().unwrap();
        all["models"].as_array().unwrap().iter().find(|m| m["model"] == "smollm2").unwrap().clone()
    };

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

#[test]
fn kv_cache_type_and_threads_change_at_run_time() {
    let engine =
        EngineInstance::create(&plugin(), &InstanceConfig { slots: 2, context_length: 1024, ..Default::default() })
            .unwrap();
    let p = model_path("smollm2-135m-instruct-q4_1.gguf");
    engine.load_model(&ModelSpec::new("m", Format::Gguf, p.display().to_string())).unwrap();
    engine.set_config(Some("m"), "kv_cache_type", &serde_json::json!("q8_0")).unwrap();
    engine.set_config(Some("m"), "threads", &serde_json::json!(1)).unwrap();
    let info = engine.model_info("m").unwrap();
    assert_eq!((info.extra["kv_cache_type"].as_str(), info.extra["threads"].as_u64()), (Some("q8_0"), Some(1)));
    let mut text = String::new();
    let res = engine
        .infer(&InferParams::new(1, "m", CHAT, Sampling { max_tokens: Some(16), ..Sampling::greedy() }), |t| {
            text.push_str(&t.text);
            true
        })
        .unwrap();
    // q8_0 keys change SmolLM2-135M's greedy answer from its first token (measured, see the
    // KV-cache notes), so this checks the setting took effect, not the answer.
    assert_eq!(res.completion_tokens, 16, "{text:?}");
    assert!(text.split_whitespace().count() >= 4, "{text:?}");
    let err = engine.set_config(Some("m"), "kv_cache_type", &serde_json::json!("q3")).unwrap_err();
    assert_eq!(err.status, EngineStatus::Unsupported);
    assert!(err.message.contains("kv_cache_type"), "{}", err.message);
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmr-llama-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
