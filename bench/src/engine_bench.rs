//! Measures an engine plugin through the host, the way a node drives it: prompt processing
//! (pp), single-sequence decode (tg) and aggregate decode at several concurrencies. Prints one
//! JSON object; `bench/engine_bench.py` runs it beside llama.cpp's own tools and reports ratios.
#![forbid(unsafe_code)]

use anyhow::{bail, Context, Result};
use clap::Parser;
use llmr_engine_host::{
    load_one, CallError, Constraint, EngineInstance, EngineRegistry, FinishReason, Format, InferParams, InferResult,
    InstanceConfig, Manifest, ModelSpec, Sampling, TokenEvent,
};
use llmr_engine_worker::{WorkerCommand, WorkerEngine};
use llmr_tool_calls::{ToolCallFormat, ToolSchema};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// Plugin folder (manifest.json + library).
    #[arg(long, default_value = "engines/llama_cpp/cpu")]
    plugin: PathBuf,
    /// A GGUF file or a safetensors model folder.
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Prompt tokens for the pp test.
    #[arg(long, default_value_t = 512)]
    pp: usize,
    /// Generated tokens for the tg test.
    #[arg(long, default_value_t = 128)]
    tg: u32,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Concurrencies for the aggregate decode test (empty = skip).
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    concurrency: Vec<u32>,
    /// Prompt tokens per sequence in the aggregate test.
    #[arg(long, default_value_t = 32)]
    npp: usize,
    /// Generated tokens per sequence in the aggregate test.
    #[arg(long, default_value_t = 64)]
    ntg: u32,
    /// Which tests to run: pp, tg, batch, and tg_json / batch_json, the same decodes under a
    /// grammar (an endless JSON array of objects, so that every token pays for its mask),
    /// tg_tools: free text under the lazy grammar of a strict tool under `tool_choice: auto`
    /// (Hermes: every token masked while the grammar watches for `<tool_call>`), and
    /// copy: answers that copy a passage of their prompt, at each concurrency, with speculative
    /// decoding (prompt lookup) on and off, and long: sequences with `npp`-token prompts
    /// decoding together from a warm prefix cache (a KV policy at long context, below). pp, tg,
    /// batch and long run with speculation off: they compare the engine's decode with
    /// llama.cpp's tools, which do not speculate.
    #[arg(long, value_delimiter = ',', default_value = "pp,tg,batch")]
    tests: Vec<String>,
    /// Context per sequence.
    #[arg(long, default_value_t = 1024)]
    ctx: u32,
    /// Sample the tg and batch tests' tokens at this temperature (seeded) instead of greedily:
    /// what a client's default request (temperature 1) costs the engine's sampling.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Top-p of those sampled tokens.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Ask for this many alternatives' log-probabilities with every token of the tg and batch
    /// tests (OpenAI's `top_logprobs`): what the engine pays for them.
    #[arg(long)]
    logprobs: Option<u32>,
    /// The model's load options, a JSON object (the native engine's `kv_policy`,
    /// `kv_budget_mib`).
    #[arg(long)]
    load_options: Option<String>,
    /// `--tests long`: write the token ids each sequence generated in the last round to this
    /// file (greedy answers of a reference configuration, such as the f16 cache with room).
    #[arg(long)]
    save_answers: Option<PathBuf>,
    /// `--tests long`: compare the last round's answers with those `--save-answers` wrote
    /// (same prompts and `--ntg`): how far each runs before its first different token, and
    /// the share of positions that agree.
    #[arg(long)]
    compare_answers: Option<PathBuf>,
    /// Settings applied to the model before the tests, `key=json` (set_config), e.g.
    /// `speculative_threshold=1` to keep speculation on but never worth a draft.
    #[arg(long = "set")]
    settings: Vec<String>,
    /// Drive the plugin in an engine worker process started from this program (`llmr` with
    /// `--worker-arg engine-worker`, or `llmr-engine-worker`), as `llmr serve` does, instead of
    /// in this process: what crash isolation costs.
    #[arg(long)]
    worker: Option<PathBuf>,
    #[arg(long)]
    worker_arg: Vec<String>,
}

impl Args {
    /// `--temperature` and `--top-p` on a request's settings (greedy when the temperature is 0),
    /// seeded so that a run repeats, and `--logprobs`.
    fn sample(&self, s: &mut Sampling, seed: u64) {
        if self.temperature > 0.0 {
            (s.temperature, s.top_p, s.seed) = (self.temperature, self.top_p, Some(seed));
        }
        s.logprobs = self.logprobs;
    }
}

/// The plugin in this process, or in a worker process.
enum Engine {
    InProcess(EngineInstance),
    Worker(Box<WorkerEngine>),
}

impl Engine {
    fn infer(
        &self,
        params: &InferParams<'_>,
        mut on_token: impl FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<InferResult, CallError> {
        match self {
            Engine::InProcess(e) => e.infer(params, on_token),
            Engine::Worker(w) => w.infer(params, &mut on_token),
        }
    }

    fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<i32>, CallError> {
        match self {
            Engine::InProcess(e) => e.tokenize("m", text, add_bos, parse_special),
            Engine::Worker(w) => w.tokenize(text, add_bos, parse_special),
        }
    }

    fn set_config(&self, key: &str, value: &serde_json::Value) -> Result<(), CallError> {
        match self {
            Engine::InProcess(e) => e.set_config(Some("m"), key, value),
            Engine::Worker(w) => w.set_config(key, value),
        }
    }

    fn metrics(&self) -> Result<serde_json::Value, CallError> {
        match self {
            Engine::InProcess(e) => e.metrics(),
            Engine::Worker(w) => w.metrics(),
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A grammar that never completes (the array is never closed), so that a decode of any length
/// stays constrained: objects of a typical API schema, one after another.
const ENDLESS_JSON: &str = r#"start: "[" item ("," item)*
item: %json {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
  "age": {"type": "integer", "minimum": 0, "maximum": 120}, "tags": {"type": "array",
  "items": {"type": "string", "maxLength": 8}, "maxItems": 3}}, "required": ["name", "age", "tags"],
  "additionalProperties": false}
"#;

/// A GGUF file, or a Hugging Face model folder (its sharded index when there is one).
fn model_spec(path: &std::path::Path) -> ModelSpec {
    if !path.is_dir() {
        return ModelSpec::new("m", Format::Gguf, path.display().to_string());
    }
    let index = path.join("model.safetensors.index.json");
    let primary = if index.is_file() { index } else { path.join("model.safetensors") };
    ModelSpec::new("m", Format::Safetensors, primary.display().to_string())
}

/// Text of exactly `n` tokens (BOS included) that shares no prefix with other calls.
fn prompt_of(engine: &Engine, n: usize, salt: u64) -> Result<String> {
    let words = ["river", "stone", "light", "paper", "window", "garden", "silver", "market", "winter", "engine"];
    let mut text = format!("{salt}");
    let mut i = salt as usize;
    loop {
        let have = engine.tokenize(&text, true, false)?.len();
        if have >= n {
            break;
        }
        // A word is one to a few tokens: add a quarter of the missing count at a time, the
        // same words in the same order as one at a time, in a few dozen tokenizations for a
        // long prompt instead of one per word (the trim below takes off any overshoot).
        for _ in 0..(n - have).div_ceil(4) {
            text.push(' ');
            text.push_str(words[i % words.len()]);
            i = i.wrapping_mul(31).wrapping_add(7);
        }
    }
    while engine.tokenize(&text, true, false)?.len() > n {
        text.pop();
    }
    Ok(text)
}

/// The median; NaN (null in the JSON) when there are no samples (`--reps 0`: one unmeasured run).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn run_pp(engine: &Engine, args: &Args) -> Result<serde_json::Value> {
    // llama-bench processes pp tokens in one decode (ubatch 512): match it with the chunk size.
    engine.set_config("prefill_chunk", &serde_json::json!(args.pp.max(512)))?;
    let mut rates = Vec::new();
    for rep in 0..args.reps + 1 {
        let prompt = prompt_of(engine, args.pp, 1000 + rep as u64)?;
        let mut p = InferParams::greedy(NEXT_ID.fetch_add(1, Ordering::Relaxed), "m", &prompt);
        p.sampling.max_tokens = Some(1);
        p.sampling.speculative = false;
        p.parse_special = false;
        let r = engine.infer(&p, |_| true)?;
        if r.completion_tokens == 0 {
            // The prompt was never read (a figure from it would be meaningless).
            bail!("pp run ended before its first token: {:?}", r.finish_reason);
        }
        let evaluated = (r.prompt_tokens - r.cached_tokens) as f64;
        if rep > 0 {
            // rep 0 warms up, as llama-bench does.
            rates.push(evaluated / (r.prompt_eval_ns as f64 / 1e9));
        }
    }
    engine.set_config("prefill_chunk", &serde_json::json!(256))?;
    Ok(serde_json::json!({ "n_prompt": args.pp, "tokens_per_s": median(rates.clone()), "samples": rates }))
}

/// The grammar of a strict tool under `tool_choice: auto` in Hermes's format (Qwen2.5's), as the
/// node builds it: free text, calls under the tool's schema wherever one opens.
fn strict_tool_grammar() -> Constraint {
    let params = serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"], "additionalProperties": false});
    let tools = [ToolSchema { name: "get_weather", parameters: Some(&params) }];
    Constraint::Lark(ToolCallFormat::Hermes.auto_call_grammar(&tools, true).expect("Hermes has a grammar"))
}

/// The engine's mask counters: (constrained tokens, seconds in the mask).
fn mask_counters(engine: &Engine) -> Result<(f64, f64)> {
    let m = engine.metrics()?;
    // The figures are per model (under `models`) or the engine's own.
    let models = m["models"].as_array().cloned().unwrap_or_default();
    let read = |key: &str| m[key].as_f64().unwrap_or(0.0) + models.iter().filter_map(|x| x[key].as_f64()).sum::<f64>();
    Ok((read("constrained_tokens_total"), read("constraint_seconds_total")))
}

/// Single-sequence decode of `args.tg` tokens (`free_text`: a story the model continues in
/// free text and may end, as under a lazy grammar; else an endless greedy decode past EOS).
fn run_tg(engine: &Engine, args: &Args, constraint: Option<&Constraint>, free_text: bool) -> Result<serde_json::Value> {
    let mut rates = Vec::new();
    let mut generated = Vec::new();
    let before = mask_counters(engine)?;
    let (mut shifts_before, mut gaps_ms) = (0, Vec::new());
    for rep in 0..args.reps + 1 {
        if rep == 1 {
            // The timed rounds' shifts only.
            shifts_before = model_counter(engine, "kv_shifts_total")?;
        }
        let prompt = if free_text {
            format!("{rep}. Once upon a time, in a quiet village by the sea,")
        } else {
            format!("{rep}")
        };
        let mut p = InferParams::greedy(NEXT_ID.fetch_add(1, Ordering::Relaxed), "m", &prompt);
        args.sample(&mut p.sampling, rep as u64);
        p.sampling.max_tokens = Some(args.tg + 1);
        p.sampling.constraint = constraint.cloned();
        p.sampling.speculative = false;
        p.ignore_eos = !free_text;
        let mut times = Vec::with_capacity(args.tg as usize + 1);
        let r = engine.infer(&p, |t| {
            times.push(t.timestamp_ns);
            true
        })?;
        if r.finish_reason != FinishReason::Length && (!free_text || r.completion_tokens < 17) {
            bail!("tg run ended early: {:?} after {} tokens", r.finish_reason, r.completion_tokens);
        }
        if rep > 0 {
            // The first token comes from the prompt step; the rest are single-token decodes.
            rates.push((r.completion_tokens - 1) as f64 / (r.generation_ns as f64 / 1e9));
            generated.push(r.completion_tokens);
            gaps_ms.extend(times.windows(2).map(|w| w[1].saturating_sub(w[0]) as f64 / 1e6));
        }
    }
    // The time between tokens: its median, and its slowest steps (the steps that paid for a
    // context shift, where the engine shifts: one per shift).
    let shifts = model_counter(engine, "kv_shifts_total")? - shifts_before;
    gaps_ms.sort_by(f64::total_cmp);
    let step_ms = serde_json::json!({
        "median": gaps_ms.get(gaps_ms.len() / 2),
        "slowest": gaps_ms.iter().rev().take((shifts as usize).clamp(1, 32)).collect::<Vec<_>>(),
        "kv_shifts": shifts,
    });
    let after = mask_counters(engine)?;
    let masked = after.0 - before.0;
    let mask_ms = (masked > 0.0).then(|| (after.1 - before.1) * 1e3 / masked);
    Ok(serde_json::json!({ "n_gen": args.tg, "tokens_per_s": median(rates.clone()), "samples": rates,
        "generated": generated, "mask_ms_per_token": mask_ms, "step_ms": step_ms }))
}

/// `run` for every prompt, each on a thread of its own, all at once; the results in prompt order.
fn each_at_once<R: Send>(prompts: &[String], run: impl Fn(&str) -> Result<R> + Sync) -> Result<Vec<R>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = prompts.iter().map(|prompt| s.spawn(|| run(prompt))).collect();
        handles.into_iter().map(|h| h.join().expect("bench thread")).collect()
    })
}

/// `n` sequences at once; decode rate = tokens after each sequence's first, over the window from
/// the first sequence's first token to the last token of all (llama-batched-bench's S_TG).
fn run_batch(engine: &Engine, args: &Args, n: u32, constraint: Option<&Constraint>) -> Result<serde_json::Value> {
    let prompts: Vec<String> =
        (0..n).map(|i| prompt_of(engine, args.npp, 50_000 + u64::from(i) * 7919)).collect::<Result<_>>()?;
    let mut rates = Vec::new();
    let mut wall_rates = Vec::new();
    let mut spreads = Vec::new();
    let mut together_rates = Vec::new();
    // Sequences that ended before `ntg` tokens (a KV cache too small for them all), over all reps.
    let mut ended_early = 0;
    for rep in 0..args.reps.min(3) + 1 {
        let start = Instant::now();
        let results = each_at_once(&prompts, |prompt| {
            let mut p = InferParams::greedy(NEXT_ID.fetch_add(1, Ordering::Relaxed), "m", prompt);
            args.sample(&mut p.sampling, p.request_id);
            p.sampling.max_tokens = Some(args.ntg);
            p.sampling.constraint = constraint.cloned();
            p.sampling.speculative = false;
            p.ignore_eos = true;
            let mut times = Vec::with_capacity(args.ntg as usize);
            let r = engine.infer(&p, |t| {
                times.push(t.timestamp_ns);
                true
            })?;
            Ok((times, r.completion_tokens))
        })?;
        let wall = start.elapsed().as_secs_f64();
        let firsts = results.iter().filter_map(|r| r.0.first().copied());
        let (t0, all_started) = (firsts.clone().min().unwrap_or(0), firsts.max().unwrap_or(0));
        let t1 = results.iter().filter_map(|r| r.0.last().copied()).max().unwrap_or(0);
        let decoded: u64 = results.iter().map(|r| u64::from(r.1.saturating_sub(1))).sum();
        let generated: u64 = results.iter().map(|r| u64::from(r.1)).sum();
        // Tokens decoded once every sequence had its first: the steps llama-batched-bench times
        // (it prefills every prompt before its first decode step).
        let together: usize = results.iter().map(|r| r.0.iter().filter(|&&t| t > all_started).count()).sum();
        ended_early += results.iter().filter(|r| r.1 < args.ntg).count();
        if rep > 0 {
            rates.push(decoded as f64 / ((t1 - t0) as f64 / 1e9));
            wall_rates.push(generated as f64 / wall);
            spreads.push((all_started - t0) as f64 / 1e6);
            if t1 > all_started {
                together_rates.push(together as f64 / ((t1 - all_started) as f64 / 1e9));
            }
        }
    }
    Ok(serde_json::json!({
        "sequences": n, "npp": args.npp, "ntg": args.ntg,
        "decode_tokens_per_s": median(rates.clone()), "samples": rates,
        "end_to_end_tokens_per_s": median(wall_rates),
        // From the first sequence's first token to the last one's: prompts still being
        // processed while others decode fall in the window above.
        "first_token_spread_ms": median(spreads),
        "all_decoding_tokens_per_s": median(together_rates),
        "ended_early": ended_early,
    }))
}

/// `n` sequences with `npp`-token prompts decoding `ntg` tokens together, the way a server
/// holds many long conversations at once. llama-batched-bench processes every prompt before
/// its first decode step; here the prompts are read once (one token each, all at once) and
/// every timed round finds them in the prefix cache, so that all `n` decode together from
/// their first steps: what the KV cache's layout and levels cost at this context, not prompt
/// processing. Cached blocks keep the levels a KV policy gave them. The engine's figures are
/// read halfway through each round (bytes held, positions per level); `whole` counts the
/// sequences that got all `ntg` tokens, `generated` the tokens of each round and `round_s` its
/// wall time, `preemptions` the sequences the engine set aside for room over the whole run (an
/// engine that ends sequences for room instead shows it in `whole`). `most_decoding` is the
/// most sequences generating at once in each round (the warm-up round's first), from the
/// engine's figures every 100 ms, with the positions and bytes held then: under a byte budget,
/// prompts that find no room wait (or are preempted) while others go on, so this, not `whole`,
/// says how many long sequences the budget served at once (with `ntg` long enough that the
/// sequences' decoding overlaps).
fn run_long(engine: &Engine, args: &Args, n: u32) -> Result<serde_json::Value> {
    let prompts: Vec<String> =
        (0..n).map(|i| prompt_of(engine, args.npp, 70_000 + u64::from(i) * 7919)).collect::<Result<_>>()?;
    fn request(prompt: &str, max_tokens: u32) -> InferParams<'_> {
        let mut p = InferParams::greedy(NEXT_ID.fetch_add(1, Ordering::Relaxed), "m", prompt);
        p.sampling.max_tokens = Some(max_tokens);
        p.sampling.speculative = false;
        p.ignore_eos = true;
        p
    }
    let start = Instant::now();
    each_at_once(&prompts, |prompt| Ok(engine.infer(&request(prompt, 1), |_| true)?))?;
    let prime_s = start.elapsed().as_secs_f64();
    let cached_before = model_counter(engine, "cached_tokens_total")?;
    let preempted_before = model_counter(engine, "preemptions_total")?;
    let (mut rates, mut whole, mut mid, mut peaks) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut generated, mut round_s, mut answers) = (Vec::new(), Vec::new(), Vec::<Vec<i32>>::new());
    for rep in 0..args.reps.min(3) + 1 {
        let halfway = std::sync::Mutex::new(None);
        let done = std::sync::atomic::AtomicBool::new(false);
        let round = Instant::now();
        let (results, peak) = std::thread::scope(|s| {
            let poller = s.spawn(|| most_decoding(engine, &done));
            let results = each_at_once(&prompts, |prompt| {
                let first = std::ptr::eq(prompt, prompts[0].as_str());
                let (mut times, mut ids) = (Vec::with_capacity(args.ntg as usize), Vec::new());
                let r = engine.infer(&request(prompt, args.ntg), |t| {
                    times.push(t.timestamp_ns);
                    ids.push(t.token_id);
                    if first && times.len() == (args.ntg as usize).div_ceil(2) {
                        *halfway.lock().unwrap() = engine.metrics().ok();
                    }
                    true
                })?;
                Ok((times, r.completion_tokens, ids))
            });
            done.store(true, Ordering::Relaxed);
            (results, poller.join().expect("poller thread"))
        });
        let results = results?;
        round_s.push(round.elapsed().as_secs_f64());
        generated.push(results.iter().map(|r| r.1).sum::<u32>());
        answers = results.iter().map(|r| r.2.clone()).collect();
        let all_started = results.iter().filter_map(|r| r.0.first().copied()).max().unwrap_or(0);
        let t1 = results.iter().filter_map(|r| r.0.last().copied()).max().unwrap_or(0);
        let together: usize = results.iter().map(|r| r.0.iter().filter(|&&t| t > all_started).count()).sum();
        if rep > 0 && t1 > all_started {
            rates.push(together as f64 / ((t1 - all_started) as f64 / 1e9));
            whole.push(results.iter().filter(|r| r.1 >= args.ntg).count() as f64);
            let m = halfway.into_inner().unwrap().unwrap_or_default();
            mid.push(model_of(&m).map(|x| serde_json::json!({"kv_bytes": x["kv_bytes"], "kv_levels": x["kv_levels"]})));
        }
        // How many the budget held at once, the warm-up round's too (`--reps 0`: that one only).
        peaks.push(peak);
    }
    let cached = model_counter(engine, "cached_tokens_total")? - cached_before;
    if let Some(path) = &args.save_answers {
        std::fs::write(path, serde_json::to_vec(&answers)?).with_context(|| format!("writing {}", path.display()))?;
    }
    let agreement = match &args.compare_answers {
        Some(path) => {
            let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let reference: Vec<Vec<i32>> = serde_json::from_slice(&text)?;
            answer_agreement(&reference, &answers)
        }
        None => serde_json::Value::Null,
    };
    Ok(serde_json::json!({
        "answers_against_reference": agreement,
        "sequences": n, "npp": args.npp, "ntg": args.ntg, "prime_s": prime_s,
        "all_decoding_tokens_per_s": median(rates.clone()), "samples": rates,
        "whole": median(whole), "halfway": mid, "most_decoding": peaks,
        "generated": generated, "round_s": round_s,
        "preemptions": model_counter(engine, "preemptions_total")? - preempted_before,
        // Prompt tokens the timed rounds found in the prefix cache, per sequence and round
        // (close to npp: the prompts were not read again).
        "cached_per_sequence": cached as f64 / (f64::from(n) * (args.reps.min(3) + 1) as f64),
    }))
}

/// How a configuration's greedy answers compare with a reference's for the same prompts:
/// tokens each answer runs before its first different one (a greedy answer that parts once
/// goes its own way after), and the share of all positions with the same token.
fn answer_agreement(reference: &[Vec<i32>], answers: &[Vec<i32>]) -> serde_json::Value {
    let first_difference: Vec<usize> =
        reference.iter().zip(answers).map(|(a, b)| a.iter().zip(b).take_while(|(x, y)| x == y).count()).collect();
    let positions: usize = reference.iter().zip(answers).map(|(a, b)| a.len().max(b.len())).sum();
    let same: usize = reference.iter().zip(answers).map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x == y).count()).sum();
    serde_json::json!({
        "sequences": reference.len().min(answers.len()),
        "first_difference": first_difference,
        "same_positions": same as f64 / positions.max(1) as f64,
    })
}

/// Until `done`, the engine's figures every 100 ms: the most sequences generating at once
/// (`decoding`, an engine without it counts as 0), and the positions (per level) and bytes the
/// cache held at the first moment of that most.
fn most_decoding(engine: &Engine, done: &std::sync::atomic::AtomicBool) -> serde_json::Value {
    let mut best = serde_json::json!({"decoding": 0});
    while !done.load(Ordering::Relaxed) {
        if let Some(m) = engine.metrics().ok().as_ref().and_then(model_of) {
            if m["decoding"].as_u64().unwrap_or(0) > best["decoding"].as_u64().unwrap_or(0) {
                best = serde_json::json!({"decoding": m["decoding"], "kv_bytes": m["kv_bytes"], "kv_levels": m["kv_levels"]});
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    best
}

/// The benchmarked model's entry in the engine's metrics.
fn model_of(metrics: &serde_json::Value) -> Option<&serde_json::Value> {
    metrics["models"].as_array()?.iter().find(|x| x["model"] == "m")
}

/// A counter of the model's metrics (0 for an engine without it).
fn model_counter(engine: &Engine, key: &str) -> Result<u64> {
    Ok(model_of(&engine.metrics()?).and_then(|x| x[key].as_u64()).unwrap_or(0))
}

/// Public-domain passages the copy test's answers repeat.
const PASSAGES: [&str; 4] = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be \
     in want of a wife. However little known the feelings or views of such a man may be on his first \
     entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families.",
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, \
     conceived in Liberty, and dedicated to the proposition that all men are created equal. Now we are \
     engaged in a great civil war, testing whether that nation, or any nation so conceived and so \
     dedicated, can long endure.",
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my \
     purse, and nothing particular to interest me on shore, I thought I would sail about a little and \
     see the watery part of the world.",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings \
     and arrows of outrageous fortune, or to take arms against a sea of troubles, and by opposing end \
     them. To die, to sleep, no more.",
];

/// Draft tokens fed and kept so far (0 for an engine that does not speculate).
fn draft_counters(engine: &Engine) -> Result<(u64, u64)> {
    Ok((model_counter(engine, "draft_tokens_total")?, model_counter(engine, "draft_accepted_total")?))
}

/// `n` sequences at once, each asked to copy a passage of its prompt (greedy, until the model
/// stops or `ntg` tokens), with speculation on and off in alternating order, one warm-up round
/// first. Decode rate as in `run_batch`. `same_outputs`: the rounds whose greedy outputs were
/// the same token for token on and off (llama.cpp's logits move a little with the batch's
/// shape, so a near tie can go the other way).
fn run_copy(engine: &Engine, args: &Args, n: u32) -> Result<serde_json::Value> {
    let prompts: Vec<String> = (0..n as usize)
        .map(|i| format!("Copy the text exactly.\n\nText: {}\n\nCopy: ", PASSAGES[i % PASSAGES.len()]))
        .collect();
    let run = |speculative: bool| -> Result<(f64, Vec<Vec<i32>>)> {
        let results = each_at_once(&prompts, |prompt| {
            let mut p = InferParams::greedy(NEXT_ID.fetch_add(1, Ordering::Relaxed), "m", prompt);
            p.sampling.max_tokens = Some(args.ntg);
            p.sampling.speculative = speculative;
            p.parse_special = false;
            let (mut times, mut ids) = (Vec::new(), Vec::new());
            engine.infer(&p, |t| {
                times.push(t.timestamp_ns);
                ids.push(t.token_id);
                true
            })?;
            Ok((times, ids))
        })?;
        let t0 = results.iter().filter_map(|r| r.0.first().copied()).min().unwrap_or(0);
        let t1 = results.iter().filter_map(|r| r.0.last().copied()).max().unwrap_or(0);
        let decoded: usize = results.iter().map(|r| r.1.len().saturating_sub(1)).sum();
        let rate = if t1 > t0 { decoded as f64 / ((t1 - t0) as f64 / 1e9) } else { f64::NAN };
        Ok((rate, results.into_iter().map(|r| r.1).collect()))
    };
    let (mut on, mut off, mut same) = (Vec::new(), Vec::new(), 0);
    let (mut drafted, mut accepted, mut tokens) = (0, 0, 0);
    for rep in 0..args.reps.min(3) + 1 {
        let mut outputs = [Vec::new(), Vec::new()];
        for speculative in if rep % 2 == 0 { [true, false] } else { [false, true] } {
            let before = draft_counters(engine)?;
            let (rate, ids) = run(speculative)?;
            let after = draft_counters(engine)?;
            if rep > 0 {
                if speculative {
                    on.push(rate);
                    drafted += after.0 - before.0;
                    accepted += after.1 - before.1;
                    tokens += ids.iter().map(Vec::len).sum::<usize>();
                } else {
                    off.push(rate);
                }
            }
            outputs[usize::from(speculative)] = ids;
        }
        if rep > 0 && outputs[0] == outputs[1] {
            same += 1;
        }
    }
    let (on, off) = (median(on.clone()), median(off.clone()));
    Ok(serde_json::json!({
        "sequences": n, "ntg": args.ntg,
        "speculative_tokens_per_s": on, "plain_tokens_per_s": off, "speedup": on / off,
        "drafted": drafted, "accepted": accepted,
        "acceptance": if drafted > 0 { accepted as f64 / drafted as f64 } else { f64::NAN },
        "tokens": tokens,
        "same_outputs": same, "rounds": args.reps.min(3),
    }))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut registry = EngineRegistry::new();
    let manifest = Manifest::load(&args.plugin, 1).with_context(|| format!("plugin {}", args.plugin.display()))?;
    let plugin = load_one(&args.plugin, manifest, &mut registry)?;
    let slots = args.concurrency.iter().copied().max().unwrap_or(1).max(1);
    let config = InstanceConfig { slots, threads: args.threads, context_length: args.ctx, ..Default::default() };
    let mut spec = model_spec(&args.model);
    if let Some(options) = &args.load_options {
        spec.options = Some(serde_json::from_str(options).context("--load-options is not JSON")?);
    }
    let engine = match &args.worker {
        None => {
            let engine = EngineInstance::create(&plugin, &config)?;
            engine.load_model(&spec)?;
            Engine::InProcess(engine)
        }
        Some(program) => {
            let command = WorkerCommand { program: program.clone(), args: args.worker_arg.clone() };
            Engine::Worker(Box::new(WorkerEngine::spawn(&command, &args.plugin, &config, &spec, None, None)?))
        }
    };
    let mut out = serde_json::json!({
        "engine": plugin.id(), "engine_version": plugin.manifest.version.to_string(),
        "model": args.model.file_name().map(|f| f.to_string_lossy().into_owned()),
        "threads": args.threads, "reps": args.reps, "in_worker_process": args.worker.is_some(),
    });
    for setting in &args.settings {
        let (key, value) = setting.split_once('=').context("--set takes key=json")?;
        let value: serde_json::Value = serde_json::from_str(value).with_context(|| format!("--set {key}: not JSON"))?;
        engine.set_config(key, &value)?;
    }
    let want = |t: &str| args.tests.iter().any(|x| x == t);
    if want("pp") {
        out["pp"] = run_pp(&engine, &args)?;
    }
    let json = Constraint::Lark(ENDLESS_JSON.into());
    let tools = strict_tool_grammar();
    for (test, constraint, free_text) in [
        ("tg", None, false),
        ("tg_json", Some(&json), false),
        ("tg_free", None, true),
        ("tg_tools", Some(&tools), true),
    ] {
        if want(test) || (test == "tg_free" && want("tg_tools")) {
            out[test] = run_tg(&engine, &args, constraint, free_text)?;
        }
    }
    for (test, constraint) in [("batch", None), ("batch_json", Some(&json))] {
        if want(test) {
            out[test] = args
                .concurrency
                .iter()
                .map(|&n| run_batch(&engine, &args, n, constraint))
                .collect::<Result<Vec<_>>>()?
                .into();
        }
    }
    if want("long") {
        out["long"] = args.concurrency.iter().map(|&n| run_long(&engine, &args, n)).collect::<Result<Vec<_>>>()?.into();
    }
    if want("copy") {
        out["copy"] = args.concurrency.iter().map(|&n| run_copy(&engine, &args, n)).collect::<Result<Vec<_>>>()?.into();
    }
    // The engine's own counters (the native engine's KV policy passes and their time among them).
    out["engine_metrics"] = engine.metrics()?;
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
