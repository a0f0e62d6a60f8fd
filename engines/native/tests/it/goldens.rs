//! Every architecture against Hugging Face `transformers` (goldens in `tests/goldens/`, made once
//! by `scripts/make_native_goldens.py`): the tiny random checkpoint of each golden is rebuilt bit
//! for bit (`random_checkpoint.rs`), run by the native engine, and its logits and greedy
//! continuation compared. Architectures the engine does not run yet must be refused by name.

use crate::random_checkpoint::{golden_checkpoint_in_temp, golden_names, load_golden};
use llmr_native_engine::arch::{BatchToken, Model, Scratch};
use llmr_native_engine::checkpoint::Checkpoint;
use llmr_native_engine::config::{ConfigError, ModelConfig};
use llmr_native_engine::kv_cache::{BlockTable, KvPool, Shape};
use serde_json::Value;

/// Keys and values are cached in f16 (the L0 level of the block cache), which moves logits by
/// about 1e-4 against transformers' f32 cache; computation is f32 throughout.
const LOGIT_TOLERANCE: f32 = 2e-3;

struct Run {
    model: Model,
    config: ModelConfig,
    pool: KvPool,
    table: BlockTable,
    scratch: Scratch,
}

impl Run {
    fn step(&mut self, tokens: &[u32], logits_for: impl Fn(usize) -> bool) -> Vec<f32> {
        let start = self.table.len;
        self.pool.reserve(&mut self.table, tokens.len()).unwrap();
        self.table.len += tokens.len();
        let batch: Vec<BatchToken> = tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| BatchToken { token, seq: 0, pos: start + i, logits: logits_for(start + i) })
            .collect();
        self.model.forward(&mut self.pool, &[&self.table], &batch, &mut self.scratch)
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn check(name: &str, golden: &Value, config: ModelConfig, checkpoint: &Checkpoint) {
    let model = Model::load(&config, checkpoint).unwrap_or_else(|e| panic!("{name}: {e}"));
    let shape = Shape { layers: config.layers, kv_heads: config.kv_heads, head_dim: config.head_dim };
    let mut run =
        Run { pool: KvPool::new(shape, 64), table: BlockTable::default(), scratch: Scratch::default(), model, config };
    let vocab = run.config.vocab;
    let input = ids(&golden["input_ids"]);
    let positions: Vec<usize> =
        golden["logits_positions"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap() as usize).collect();
    let logits = run.step(&input, |p| positions.contains(&p));
    let mut worst = 0f32;
    for (row, want) in logits.chunks_exact(vocab).zip(golden["logits"].as_array().unwrap()) {
        for (got, want) in row.iter().zip(want.as_array().unwrap()) {
            worst = worst.max((got - want.as_f64().unwrap() as f32).abs());
        }
    }
    eprintln!("{name}: logits within {worst:.2e} of transformers");
    assert!(worst <= LOGIT_TOLERANCE, "{name}: logits differ from transformers by up to {worst}");
    // Greedy continuation through the cache, one token a step, as the scheduler decodes.
    let want = ids(&golden["greedy"]["tokens"]);
    let mut last = logits[logits.len() - vocab..].to_vec();
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let next = llmr_sampling::argmax(&last) as u32;
        got.push(next);
        last = run.step(&[next], |_| true);
    }
    assert_eq!(got, want, "{name}: greedy continuation (logits within {worst})");
}

#[test]
fn every_architecture_matches_transformers_or_is_refused_by_name() {
    let names = golden_names();
    assert!(names.len() >= 7, "goldens missing: {names:?}");
    let mut checked = Vec::new();
    for name in &names {
        let golden = load_golden(name);
        let dir = golden_checkpoint_in_temp(name);
        let parsed = ModelConfig::read(&dir.join("config.json"));
        match parsed {
            Ok(config) => {
                let checkpoint = Checkpoint::open(&dir.join("model.safetensors")).unwrap();
                check(name, &golden, config, &checkpoint);
                checked.push(name.as_str());
            }
            Err(ConfigError::Unsupported(arch)) => {
                assert_eq!(arch, "gpt_oss", "{name}: {arch} refused");
            }
            Err(e) => panic!("{name}: {e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert_eq!(
        checked,
        ["gemma3_text", "gemma3_text_softcap_linear", "llama", "llama_rope_llama3", "llama_tied", "qwen2"]
    );
}
