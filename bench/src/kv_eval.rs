//! What the native engine's staged KV cache costs in quality (issue 13): the first `--ctx`
//! tokens of a text teacher-forced over an f16 cache and over one run by a KV policy after every
//! step (`llmr_native_engine::kv_eval` has the method): `--level` for a static level of every
//! block outside the window and the sinks, or `--profile` for the dynamic policy, under a
//! budget of `--budget-share` of the f16 cache's bytes. Prints one JSON object: perplexity of
//! both runs, relative delta-PPL, KL divergence (mean, p99.9), top-1 agreement, KV bytes
//! measured from both caches, seconds of each run and of the policy's passes.
//!
//!   kv-eval --model ~/.cache/llmr/models/smollm2-hf \
//!           --text ~/.cache/llmr/models/corpus/hamlet_gut.txt --ctx 2048 --level int8
//!   kv-eval ... --ctx 4096 --profile balanced --budget-share 0.3
//!
//! `--passkey N` asks instead whether the policy keeps a fact from far back: N prompts of
//! `--ctx` tokens of the text, each with a pass key said once at a depth from 5% to 95% and
//! asked for at the end, answered greedily over both caches (`llmr_native_engine::kv_retrieval`).
//! Prints one JSON object: the answers each cache got right, per depth, and the KV bytes.
//!
//! `--calibrate` runs a fixed set instead (static int8 and int4, the balanced and aggressive
//! profiles under pressure), fits what each level costs this model and writes the table into the
//! model's folder (`llmr_kv_policy::Calibration`), where the engine reads it at load to report
//! `delta_ppl_est`.

use anyhow::{bail, Context, Result};
use clap::Parser;
use llmr_kv_policy::{Calibration, CalibrationPoint, KvPolicy};
use llmr_native_engine::arch::Model;
use llmr_native_engine::checkpoint::Checkpoint;
use llmr_native_engine::config::ModelConfig;
use llmr_native_engine::kv_cache::{Shape, BLOCK_TOKENS};
use llmr_native_engine::kv_eval::{evaluate, EvalOptions, EvalReport};
use llmr_native_engine::kv_retrieval::{answer, passkey_prompts, ANSWER_TOKENS};
use llmr_native_engine::tokenizer::ModelTokenizer;
use std::path::PathBuf;

#[derive(Parser)]
struct Args {
    /// A safetensors model folder.
    #[arg(long)]
    model: PathBuf,
    /// The text to score (its first `--ctx` tokens).
    #[arg(long)]
    text: PathBuf,
    #[arg(long, default_value_t = 2048)]
    ctx: usize,
    /// Tokens fed per step.
    #[arg(long, default_value_t = 64)]
    step: usize,
    /// The most recent positions kept in f16.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// int8 or int4: the static level of every full block outside the window and the sinks.
    #[arg(long, default_value = "int8", conflicts_with = "profile")]
    level: String,
    /// safe, balanced or aggressive: the dynamic policy with that profile instead.
    #[arg(long)]
    profile: Option<String>,
    /// The policy run's KV budget as a share of the f16 cache of `--ctx` tokens (the pressure
    /// the dynamic policy sees).
    #[arg(long, default_value_t = 1.0)]
    budget_share: f64,
    /// Share (0..1) of the changeable blocks then evicted, the least attended first.
    #[arg(long, default_value_t = 0.0)]
    evict: f64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Measure the model's calibration table and write it into its folder.
    #[arg(long, conflicts_with_all = ["profile", "evict"])]
    calibrate: bool,
    /// Pass-key retrieval over this many prompts instead of perplexity.
    #[arg(long, conflicts_with = "calibrate")]
    passkey: Option<usize>,
    /// Keep the f16 copies of blocks stored lower, as serving does by default: the policy
    /// promotes blocks back.
    #[arg(long)]
    copies: bool,
    /// With copies, evicted blocks keep an int4 index of their keys and are read back for a
    /// step where a query would give them this share of its attention (serving's default:
    /// 0.05). With `--calibrate`, the table is for serving with recall on.
    #[arg(long)]
    recall: Option<f32>,
    /// Steps of 64 tokens and more take AMX tiles where the CPU has them (the engine's
    /// `amx_products`, on by default); `false` keeps their products on the AVX-512 kernels: what
    /// the tiles' bf16 rounding costs in perplexity. The tiles read int8 and int4 blocks widened
    /// from their codes, where decoding tokens read the codes in integer arithmetic (int4's
    /// mean KLD 4-6% higher on SmolLM2 and Qwen2.5, 17% on Gemma 3): `false` measures a level
    /// as decode reads it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    amx_products: bool,
}

/// The runs a calibration fits to: (policy patch, budget share, what it is).
fn calibration_runs(window: usize) -> Vec<(serde_json::Value, f64, String)> {
    let fixed = |level: &str| (serde_json::json!({"static_level": level, "recent_window": window}), 1.0);
    let dynamic = |profile: &str, share: f64| {
        (serde_json::json!({"mode": "dynamic", "profile": profile, "recent_window": window}), share)
    };
    [
        (fixed("int8"), "static int8".to_string()),
        (fixed("int4"), "static int4".to_string()),
        (dynamic("balanced", 0.5), "balanced at 0.5 of the f16 bytes".to_string()),
        (dynamic("balanced", 0.25), "balanced at 0.25 of the f16 bytes".to_string()),
        (dynamic("aggressive", 0.34), "aggressive at 0.34 of the f16 bytes".to_string()),
        (dynamic("aggressive", 0.25), "aggressive at 0.25 of the f16 bytes".to_string()),
    ]
    .into_iter()
    .map(|((patch, share), what)| (patch, share, what))
    .collect()
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !(0.0..=1.0).contains(&a.evict) {
        bail!("--evict {} is not a share between 0 and 1", a.evict);
    }
    if a.recall.is_some_and(|s| !(s > 0.0 && s.is_finite())) {
        bail!("--recall must be a positive share");
    }
    if a.step == 0 || !(a.budget_share > 0.0 && a.budget_share <= 1.0) {
        bail!("--step must be positive and --budget-share a share in (0, 1]");
    }
    rayon::ThreadPoolBuilder::new().num_threads(a.threads).build_global()?;
    let mut config = ModelConfig::read(&a.model.join("config.json"))?;
    config.amx_products = a.amx_products;
    let index = a.model.join("model.safetensors.index.json");
    let primary = if index.is_file() { index } else { a.model.join("model.safetensors") };
    let model = Model::load(&config, &Checkpoint::open(&primary)?)?;
    let tokenizer =
        ModelTokenizer::load(&a.model, config.vocab, &config.eos, config.bos).map_err(anyhow::Error::msg)?;
    let text = std::fs::read_to_string(&a.text).with_context(|| a.text.display().to_string())?;
    let text_tokens = tokenizer.encode(&text, true, false).map_err(anyhow::Error::msg)?;
    if text_tokens.len() < a.ctx || a.ctx <= a.window + 1 {
        bail!("--ctx {} needs a text of as many tokens ({}) and more than --window + 1", a.ctx, text_tokens.len());
    }
    let tokens = &text_tokens[..a.ctx];
    let shape = Shape { layers: config.layers, kv_heads: config.kv_heads, head_dim: config.head_dim };
    let f16_bytes = a.ctx.div_ceil(BLOCK_TOKENS) * shape.block_bytes();
    let options_for = |patch: &serde_json::Value, budget_share: f64, evict: f64| -> Result<EvalOptions> {
        Ok(EvalOptions {
            step: a.step,
            policy: KvPolicy::baseline().patched_json(patch)?,
            budget: Some((f16_bytes as f64 * budget_share) as usize),
            evict,
            control_ids: tokenizer.control_ids.clone(),
            copies: a.copies,
            recall: a.recall,
        })
    };
    let run = |patch: &serde_json::Value, budget_share: f64, evict: f64| -> Result<(KvPolicy, EvalReport)> {
        let options = options_for(patch, budget_share, evict)?;
        Ok((options.policy, evaluate(&model, shape, config.vocab, tokens, &options)?))
    };
    let model_name = a.model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let report = |policy: &KvPolicy, budget_share: f64, evict: f64, r: &EvalReport| {
        serde_json::json!({
            "model": model_name,
            "ctx": a.ctx, "step": a.step, "evict": evict, "budget_share": budget_share, "policy": policy,
            "threads": a.threads,
            "scored": r.scored, "ppl_f16": r.ppl_f16, "ppl": r.ppl, "delta_ppl_rel": r.delta_ppl_rel(),
            "kld_mean": r.kld_mean, "kld_p999": r.kld_p999, "top1_agreement": r.top1_agreement,
            "kv_bytes_f16": r.kv_bytes_f16, "kv_bytes": r.kv_bytes,
            "kv_saving": 1.0 - r.kv_bytes as f64 / r.kv_bytes_f16 as f64, "levels": r.levels,
            "seconds_f16": r.seconds_f16, "seconds": r.seconds,
            "policy_seconds": r.policy_seconds, "passes": r.passes,
            "copies": a.copies || a.recall.is_some(), "recall": a.recall, "recalls": r.recalls,
            "promoted": r.promoted,
        })
    };
    let patch = match &a.profile {
        Some(profile) => serde_json::json!({"mode": "dynamic", "profile": profile, "recent_window": a.window}),
        None => serde_json::json!({"static_level": a.level, "recent_window": a.window}),
    };
    if let Some(n) = a.passkey {
        let options = options_for(&patch, a.budget_share, a.evict)?;
        let mut trials = Vec::new();
        let (mut right_f16, mut right, mut same) = (0, 0, 0);
        let (mut kv_bytes, mut kv_bytes_f16, mut levels, mut recalls, mut promoted) = (0, 0, [0usize; 4], 0, 0);
        for p in passkey_prompts(&tokenizer, &text_tokens, a.ctx, n).map_err(anyhow::Error::msg)? {
            let r = answer(&model, shape, config.vocab, &p.tokens, ANSWER_TOKENS, &options)?;
            let text = |ids: &[u32]| ids.iter().map(|&id| tokenizer.piece(id)).collect::<String>();
            let (got_f16, got) = (text(&r.f16), text(&r.policy));
            let (ok_f16, ok) = (got_f16.contains(&p.key), got.contains(&p.key));
            (right_f16, right, same) =
                (right_f16 + ok_f16 as usize, right + ok as usize, same + (r.f16 == r.policy) as usize);
            (kv_bytes, kv_bytes_f16) = (kv_bytes + r.kv_bytes, kv_bytes_f16 + r.kv_bytes_f16);
            levels = [0, 1, 2, 3].map(|l| levels[l] + r.levels[l]);
            recalls += r.recalls;
            promoted += r.promoted;
            eprintln!("depth {:.2}: key {} f16 {got_f16:?} policy {got:?}", p.depth, p.key);
            trials.push(serde_json::json!({"depth": p.depth, "f16": ok_f16, "policy": ok}));
        }
        println!(
            "{}",
            serde_json::json!({
                "model": model_name, "ctx": a.ctx, "step": a.step, "evict": a.evict,
                "budget_share": a.budget_share, "policy": options.policy, "threads": a.threads,
                "prompts": n, "right_f16": right_f16, "right": right, "same_answer": same,
                "kv_bytes_f16": kv_bytes_f16 / n.max(1), "kv_bytes": kv_bytes / n.max(1),
                "kv_saving": 1.0 - kv_bytes as f64 / kv_bytes_f16.max(1) as f64,
                "levels": levels.map(|l| l / n.max(1)),
                "copies": a.copies || a.recall.is_some(), "recall": a.recall, "recalls": recalls,
                "promoted": promoted, "trials": trials,
            })
        );
        return Ok(());
    }
    if !a.calibrate {
        let (policy, r) = run(&patch, a.budget_share, a.evict)?;
        println!("{}", report(&policy, a.budget_share, a.evict, &r));
        return Ok(());
    }
    let mut points = Vec::new();
    for (patch, share, what) in calibration_runs(a.window) {
        match run(&patch, share, 0.0) {
            Ok((policy, r)) => {
                // One line per run on stderr, the table on stdout.
                eprintln!("{what}: {}", report(&policy, share, 0.0, &r));
                let levels = r.levels.map(|n| n as u64);
                points.push(CalibrationPoint { run: what, levels, delta_ppl_pct: r.delta_ppl_rel() * 100.0 });
            }
            // A budget a profile cannot hold (safe never evicts) is a run left out, not a failure.
            Err(e) => eprintln!("{what}: left out: {e:#}"),
        }
    }
    let corpus = a.text.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let mut table = Calibration::fit(model_name, corpus, a.ctx, points).map_err(anyhow::Error::msg)?;
    table.recall = a.recall;
    table.write(&a.model).with_context(|| format!("writing the table into {}", a.model.display()))?;
    println!("{}", serde_json::to_string_pretty(&table)?);
    Ok(())
}
