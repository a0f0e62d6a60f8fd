//! The CUDA backend (feature `cuda`) on a machine with an NVIDIA GPU and CUDA's libraries:
//! `cargo test --release -p llmr-native-engine --features cuda cuda::` (bench/cuda/run.sh runs
//! them on a GPU machine without Rust). CI builds and lints these but has no GPU to run them.

use crate::goldens::{check_model, ids};
use crate::random_checkpoint::{golden_checkpoint_in_temp, golden_names, load_golden};
use crate::support::{cached_model, cuda_plugin};
use llmr_engine_host::{EngineInstance, InferParams, InstanceConfig, Sampling};
use llmr_native_engine::arch::{BatchToken, Model, Picked, Scratch};
use llmr_native_engine::checkpoint::Checkpoint;
use llmr_native_engine::config::ModelConfig;
use llmr_native_engine::cuda::{CudaModel, LoadError};
use llmr_native_engine::kv_cache::{BlockTable, KvPool, Shape};
use llmr_native_engine::tokenizer::ModelTokenizer;
use llmr_sampling::{DevicePick, TemperatureSampler};
use std::path::Path;

/// The inputs of the GPU's matrix products are rounded to the weights' bf16 (cuBLAS multiplies
/// like types), which moves these tiny models' logits by about 1e-2 against transformers' f32
/// compute (transformers' own bf16 compute moves them by 0.012 to 0.025: tests/goldens/README.md).
const GPU_LOGIT_TOLERANCE: f32 = 3e-2;

fn shape(c: &ModelConfig) -> Shape {
    Shape { layers: c.layers, kv_heads: c.kv_heads, head_dim: c.head_dim }
}

fn on_gpu(config: &ModelConfig, checkpoint: &Checkpoint, blocks: usize) -> Result<(Model, KvPool), LoadError> {
    let model = CudaModel::load(config, checkpoint, 0, (shape(config), blocks), None)?;
    Ok((Model::Cuda(Box::new(model)), KvPool::without_storage(shape(config), blocks)))
}

#[test]
fn every_dense_golden_matches_transformers_on_the_gpu() {
    let mut checked = Vec::new();
    for name in golden_names() {
        let golden = load_golden(&name);
        let dir = golden_checkpoint_in_temp(&name);
        let config = ModelConfig::read(&dir.join("config.json")).unwrap();
        let checkpoint = Checkpoint::open(&dir.join("model.safetensors")).unwrap();
        match on_gpu(&config, &checkpoint, 64) {
            Ok((model, pool)) => {
                check_model(&name, &golden, config, model, pool, GPU_LOGIT_TOLERANCE, true);
                checked.push(name.clone());
            }
            Err(LoadError::Unsupported(why)) if name == "gpt_oss" => eprintln!("gpt_oss: {why}"),
            Err(e) => panic!("{name}: {e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert_eq!(
        checked,
        ["gemma3_text", "gemma3_text_softcap_linear", "llama", "llama_rope_llama3", "llama_tied", "qwen2"]
    );
}

/// The picks a test asks for, cycling: greedy, temperature draws with and without top-p and
/// min-p (llmr_sampling's settings, their random numbers from a seeded generator), and a row
/// left to the host.
fn pick_for(k: usize, seed: u64) -> Option<DevicePick> {
    let draw = |t: f32, top_p: f32, min_p: f32| {
        Some(DevicePick::Draw(TemperatureSampler::new(t, top_p, min_p, seed).next_draw()))
    };
    match k % 7 {
        0 => Some(DevicePick::Argmax),
        1 => draw(1.0, 1.0, 0.0),
        2 => draw(0.7, 0.9, 0.0),
        3 => draw(1.3, 1.0, 0.05),
        4 => draw(1.0, 0.5, 0.0),
        5 => draw(0.4, 0.95, 0.02),
        _ => None,
    }
}

/// Steps whose ids the device picks (`Model::pick`) against the host's picks from the same
/// step's logits: one sequence read as logits, one as picks, over the same tokens (a prompt
/// chunk, then decoding steps replayed as graphs, each repeated with new picks). Every pick
/// must be the host's (the device computes the host's top-p cut, weights and sums to the bit),
/// and rows without a pick come back as the same logits.
fn device_picks_match_the_host(dir: &Path, tokens: &[u32], repeats: usize) {
    let config = ModelConfig::read(&dir.join("config.json")).unwrap();
    let checkpoint = Checkpoint::open(&crate::support::primary(dir)).unwrap();
    let n = tokens.len();
    let (gpu, mut pool) = on_gpu(&config, &checkpoint, 2 * n.div_ceil(16) + 2).unwrap();
    let mut tables = vec![BlockTable::default(), BlockTable::default()];
    for t in &mut tables {
        pool.reserve(t, n).unwrap();
    }
    let batch = |seq: usize, start: usize, end: usize| -> Vec<BatchToken> {
        (start..end).map(|pos| BatchToken { token: tokens[pos], seq, pos, logits: true }).collect()
    };
    let mut runs = vec![(0, n / 2)];
    runs.extend((n / 2..n).map(|p| (p, p + 1)));
    // Draws without top-p and with it: (agreeing with the host, all).
    let (mut plain, mut nucleus) = ((0, 0), (0, 0));
    let (mut greedy, mut rows_back, mut k) = (0, 0, 0);
    for (start, end) in runs {
        for t in &mut tables {
            t.len = end;
        }
        let refs: Vec<&BlockTable> = tables.iter().collect();
        let logits = gpu.forward(&mut pool, &refs, &batch(0, start, end), &mut Scratch::default()).unwrap();
        for _ in 0..repeats {
            let picks: Vec<Option<DevicePick>> = (start..end).map(|_| (pick_for(k, k as u64), k += 1).0).collect();
            let got = gpu.pick(&refs, &batch(1, start, end), &picks).expect("a GPU model picks ids").unwrap();
            assert_eq!(got.len(), picks.len());
            for ((row, pick), got) in logits.chunks_exact(config.vocab).zip(&picks).zip(got) {
                match (pick, got) {
                    (Some(DevicePick::Argmax), Picked::Id(id)) => {
                        assert_eq!(id as usize, llmr_sampling::argmax(row), "greedy, positions {start}..{end}");
                        greedy += 1;
                    }
                    (Some(DevicePick::Draw(d)), Picked::Id(id)) => {
                        assert!((id as usize) < config.vocab && row[id as usize].is_finite(), "drew {id}");
                        let host = d.choose(row);
                        if host != id as usize {
                            eprintln!("{}: {d:?}: the device drew {id}, the host {host}", dir.display());
                        }
                        let tally = if d.top_p < 1.0 { &mut nucleus } else { &mut plain };
                        *tally = (tally.0 + (host == id as usize) as usize, tally.1 + 1);
                    }
                    (None, Picked::Logits(l)) => {
                        assert_eq!(l, row, "a row left to the host comes back as its logits");
                        rows_back += 1;
                    }
                    (pick, got) => panic!("{pick:?} came back as {got:?}"),
                }
            }
        }
    }
    eprintln!(
        "{}: draws as the host draws: {}/{} without top-p, {}/{} with it; {greedy} greedy, {rows_back} rows of logits",
        dir.display(),
        plain.0,
        plain.1,
        nucleus.0,
        nucleus.1
    );
    assert!(plain.1 > 0 && nucleus.1 > 0 && greedy > 0 && rows_back > 0);
    assert_eq!(plain.0, plain.1, "draws without top-p agree with the host's");
    assert_eq!(nucleus.0, nucleus.1, "draws with top-p agree with the host's");
    let Model::Cuda(m) = &gpu else { unreachable!() };
    assert!(m.captured_steps() > 0, "decoding steps were not captured as CUDA graphs");
}

#[test]
fn the_gpu_picks_the_ids_the_host_picks_from_its_logits() {
    for name in ["llama", "gemma3_text_softcap_linear"] {
        let golden = load_golden(name);
        let dir = golden_checkpoint_in_temp(name);
        device_picks_match_the_host(&dir, &ids(&golden["input_ids"]), 40);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The same over real vocabularies (49,152 and 262,144 ids), where each warp of the draw
/// kernel walks many stretches of 32 ids.
#[test]
fn the_gpu_draws_what_the_host_draws_over_a_real_vocabulary() {
    for name in ["smollm2-hf", "gemma3-hf"] {
        let dir = cached_model(name);
        let tokens: Vec<u32> = (0..40u32).map(|i| 100 + i * 37).collect();
        device_picks_match_the_host(&dir, &tokens, 10);
    }
}

/// Through the plugin on the GPU: a seeded sampled request gives the same tokens again, and the
/// same tokens as when its logits come to the host (asking for logprobs keeps a request off the
/// device's draw): a seed means the same answer whichever side draws.
#[test]
fn a_seeded_request_draws_the_same_tokens_on_the_gpu_as_on_the_host() {
    let plugin = cuda_plugin();
    let e = EngineInstance::create(&plugin, &InstanceConfig { slots: 2, context_length: 256, ..Default::default() })
        .unwrap();
    let dir = cached_model("smollm2-hf");
    e.load_model(&crate::support::spec("smollm2", &dir)).unwrap();
    let run = |top_p: f32, logprobs: Option<u32>| -> Vec<u32> {
        let sampling = Sampling {
            max_tokens: Some(48),
            temperature: 0.9,
            top_p,
            seed: Some(1234),
            logprobs,
            ..Sampling::default()
        };
        let mut p = InferParams::new(1, "smollm2", "Once upon a time", sampling);
        p.ignore_eos = true;
        let mut got = Vec::new();
        e.infer(&p, |t| {
            got.push(t.token_id as u32);
            true
        })
        .unwrap();
        got
    };
    for top_p in [1.0, 0.9] {
        let on_gpu = run(top_p, None);
        assert_eq!(on_gpu.len(), 48);
        assert_eq!(on_gpu, run(top_p, None), "top-p {top_p}: the same seed draws the same tokens on the GPU");
        assert_eq!(on_gpu, run(top_p, Some(1)), "top-p {top_p}: the GPU's draws and the host's, from the same seed");
    }
}

/// The plugin as a node loads it from `engines/native/cuda/`: the scheduler's continuous
/// batching over device blocks, with three requests of each golden at once.
#[test]
fn the_plugin_generates_the_reference_tokens_on_the_gpu() {
    let plugin = cuda_plugin();
    let e = EngineInstance::create(&plugin, &InstanceConfig { slots: 4, context_length: 256, ..Default::default() })
        .unwrap();
    for name in golden_names().into_iter().filter(|n| n != "gpt_oss") {
        let golden = load_golden(&name);
        let dir = golden_checkpoint_in_temp(&name);
        e.load_model(&crate::support::spec(&name, &dir)).unwrap_or_else(|err| panic!("{name}: {err}"));
        let prompt: Vec<String> = ids(&golden["input_ids"]).iter().map(|i| format!("t{i}")).collect();
        let prompt = prompt.join(" ");
        let want = ids(&golden["greedy"]["tokens"]);
        let got: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|i| {
                    let (e, name, prompt) = (&e, &name, &prompt);
                    let max = Some(want.len() as u32);
                    s.spawn(move || {
                        let mut p =
                            InferParams::new(i + 1, name, prompt, Sampling { max_tokens: max, ..Sampling::greedy() });
                        p.ignore_eos = true;
                        let mut got = Vec::new();
                        e.infer(&p, |t| {
                            got.push(t.token_id as u32);
                            true
                        })
                        .unwrap_or_else(|err| panic!("{name}: {err}"));
                        got
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for g in got {
            assert_eq!(g, want, "{name}: greedy tokens through the plugin on the GPU");
        }
        e.unload_model(&name).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Teacher-forced logits of one long text on the CPU and on the GPU: the whole text as one
/// prompt, then its second half again one token a step through the device cache.
fn compare_with_cpu(dir: &Path) {
    let config = ModelConfig::read(&dir.join("config.json")).unwrap();
    let checkpoint = Checkpoint::open(&crate::support::primary(dir)).unwrap();
    let tokenizer = ModelTokenizer::load(dir, config.vocab, &config.eos, config.bos).unwrap();
    let text = "The history of the bicycle begins in the early nineteenth century, when inventors in Europe \
                tried to build a machine that a person could ride without a horse. The first designs had no \
                pedals: riders pushed along the ground with their feet. Pedals came later, then chains, gears \
                and pneumatic tyres, and by 1900 the bicycle had become the cheapest way to travel for millions.";
    let tokens = tokenizer.encode(text, true, true).unwrap();
    let n = tokens.len();
    // Each step: the positions (start, end) it runs.
    let run = |model: &Model, pool: &mut KvPool, steps: &[(usize, usize)]| -> Vec<f32> {
        let mut table = BlockTable::default();
        let mut out = Vec::new();
        for &(start, end) in steps {
            pool.reserve(&mut table, end - start).unwrap();
            table.len += end - start;
            let batch: Vec<BatchToken> =
                (start..end).map(|pos| BatchToken { token: tokens[pos], seq: 0, pos, logits: pos >= n / 2 }).collect();
            out.extend(model.forward(pool, &[&table], &batch, &mut Scratch::default()).unwrap());
        }
        pool.free_table(&mut table);
        out
    };
    let blocks = n.div_ceil(16) + 1;
    let cpu = Model::load(&config, &checkpoint).unwrap();
    let want = run(&cpu, &mut KvPool::new(shape(&config), blocks), &[(0, n)]);
    let (gpu, mut pool) = on_gpu(&config, &checkpoint, blocks).unwrap();
    let prefill = run(&gpu, &mut pool, &[(0, n)]);
    let mut steps = vec![(0, n / 2)];
    steps.extend((n / 2..n).map(|p| (p, p + 1)));
    let decode = run(&gpu, &mut pool, &steps);
    let Model::Cuda(m) = &gpu else { unreachable!() };
    assert!(m.captured_steps() > 0, "decoding steps were not captured as CUDA graphs");
    let v = config.vocab;
    for (how, got) in [("prefill", &prefill), ("decode", &decode)] {
        assert_eq!(got.len(), want.len());
        let (mut agree, mut worst, mut spread) = (0, 0f32, 0f32);
        for (g, w) in got.chunks_exact(v).zip(want.chunks_exact(v)) {
            agree += (llmr_sampling::argmax(g) == llmr_sampling::argmax(w)) as usize;
            let (lo, hi) = w.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            spread = spread.max(hi - lo);
            worst = g.iter().zip(w).fold(worst, |m, (a, b)| m.max((a - b).abs()));
        }
        let rows = want.len() / v;
        eprintln!(
            "{}: GPU {how} vs CPU: top-1 {agree}/{rows}, max |logit difference| {worst:.4} (logit range {spread:.2})",
            dir.display()
        );
        assert!(agree * 100 >= rows * 95, "{how}: top-1 agreement {agree}/{rows}");
        assert!(worst <= 0.02 * spread, "{how}: logits differ by {worst} over a range of {spread}");
    }
}

/// Embeddings (last-token pooling through the final norm) of the GPU plugin and the CPU one.
#[test]
fn embeddings_on_the_gpu_match_the_cpu() {
    use crate::embeddings::{cosine, embed};
    let texts = ["The quick brown fox jumps over the lazy dog.", "fn main() { println!(\"hello\"); }"];
    let plugin = cuda_plugin();
    let gpu = EngineInstance::create(&plugin, &InstanceConfig { slots: 2, context_length: 256, ..Default::default() })
        .unwrap();
    let cpu = crate::support::engine(2);
    let dir = cached_model("smollm2-hf");
    for e in [&gpu, &cpu] {
        e.load_model(&crate::support::spec("smollm2", &dir)).unwrap();
    }
    let (on_gpu, gpu_tokens) = embed(&gpu, "smollm2", &texts, true);
    let (on_cpu, cpu_tokens) = embed(&cpu, "smollm2", &texts, true);
    assert_eq!(gpu_tokens, cpu_tokens);
    for (g, c) in on_gpu.iter().zip(&on_cpu) {
        let cos = cosine(g, c);
        eprintln!("GPU vs CPU embedding: cosine {cos:.6}");
        assert!(cos > 0.999, "cosine {cos}");
    }
}

#[test]
fn the_gpu_tracks_the_cpu_on_smollm2() {
    compare_with_cpu(&cached_model("smollm2-hf"));
}

#[test]
fn the_gpu_tracks_the_cpu_on_gemma3() {
    compare_with_cpu(&cached_model("gemma3-hf"));
}

#[test]
fn the_gpu_tracks_the_cpu_on_qwen2_5() {
    compare_with_cpu(&cached_model("qwen2.5-hf"));
}
