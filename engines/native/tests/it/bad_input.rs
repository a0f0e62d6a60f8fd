//! Checkpoints that are sharded, broken or do not belong together, on the tiny llama of the
//! goldens (`random_checkpoint.rs`): what loads must compute the same, what cannot load must say
//! why, and a failed load must leave the engine serving its other models.

use crate::random_checkpoint::{load_golden, safetensors_bytes, tensor_specs, tokenizer_json, write_checkpoint};
use crate::support::{engine, spec};
use llmr_engine_host::{EngineStatus, InferParams, Sampling};
use llmr_native_engine::arch::{BatchToken, Model, Scratch};
use llmr_native_engine::checkpoint::Checkpoint;
use llmr_native_engine::config::ModelConfig;
use llmr_native_engine::kv_cache::{BlockTable, KvPool, Shape};
use std::path::{Path, PathBuf};

fn tiny_llama(root: &Path, name: &str) -> PathBuf {
    let golden = load_golden("llama");
    let dir = root.join(name);
    write_checkpoint(&dir, &golden["config"], &tensor_specs(&golden).unwrap()).unwrap();
    dir
}

fn logits(dir: &Path, primary: &str) -> Vec<f32> {
    let config = ModelConfig::read(&dir.join("config.json")).unwrap();
    let model = Model::load(&config, &Checkpoint::open(&dir.join(primary)).unwrap()).unwrap();
    let mut pool =
        KvPool::new(Shape { layers: config.layers, kv_heads: config.kv_heads, head_dim: config.head_dim }, 4);
    let mut table = BlockTable::default();
    let tokens = [5u32, 17, 99, 3, 250, 42];
    pool.reserve(&mut table, tokens.len()).unwrap();
    table.len = tokens.len();
    let batch: Vec<BatchToken> =
        tokens.iter().enumerate().map(|(pos, &token)| BatchToken { token, seq: 0, pos, logits: true }).collect();
    model.forward(&mut pool, &[&table], &batch, &mut Scratch::default()).unwrap()
}

#[test]
fn a_sharded_checkpoint_computes_what_the_single_file_does() {
    let tmp = tempfile::tempdir().unwrap();
    let single = tiny_llama(tmp.path(), "single");
    let sharded = tiny_llama(tmp.path(), "sharded");
    std::fs::remove_file(sharded.join("model.safetensors")).unwrap();
    let tensors = tensor_specs(&load_golden("llama")).unwrap();
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let mut map = serde_json::Map::new();
    for (file, part) in [("model-00001-of-00002.safetensors", a), ("model-00002-of-00002.safetensors", b)] {
        std::fs::write(sharded.join(file), safetensors_bytes(part)).unwrap();
        for t in part {
            map.insert(t.name.clone(), file.into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(sharded.join("model.safetensors.index.json"), index.to_string()).unwrap();
    assert_eq!(logits(&single, "model.safetensors"), logits(&sharded, "model.safetensors.index.json"));
    // An index that points outside the model's folder is refused.
    let mut escaping = index.clone();
    escaping["weight_map"]["lm_head.weight"] = "../single/model.safetensors".into();
    std::fs::write(sharded.join("model.safetensors.index.json"), escaping.to_string()).unwrap();
    let err = Checkpoint::open(&sharded.join("model.safetensors.index.json")).err().unwrap().to_string();
    assert!(err.contains("outside the model's folder"), "{err}");
}

#[test]
fn broken_checkpoints_fail_to_load_with_the_reason_and_the_engine_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let e = engine(2);
    let good = tiny_llama(tmp.path(), "good");
    e.load_model(&spec("good", &good)).unwrap();

    let unsupported = tiny_llama(tmp.path(), "mamba");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(unsupported.join("config.json")).unwrap()).unwrap();
    config["model_type"] = "mamba".into();
    std::fs::write(unsupported.join("config.json"), config.to_string()).unwrap();

    let truncated = tiny_llama(tmp.path(), "truncated");
    let bytes = std::fs::read(truncated.join("model.safetensors")).unwrap();
    std::fs::write(truncated.join("model.safetensors"), &bytes[..bytes.len() - 1000]).unwrap();

    let missing = tiny_llama(tmp.path(), "missing");
    let golden = load_golden("llama");
    let tensors: Vec<_> = tensor_specs(&golden)
        .unwrap()
        .into_iter()
        .filter(|t| t.name != "model.layers.1.mlp.down_proj.weight")
        .collect();
    std::fs::write(missing.join("model.safetensors"), safetensors_bytes(&tensors)).unwrap();

    let wrong_shape = tiny_llama(tmp.path(), "wrong-shape");
    config = golden["config"].clone();
    config["intermediate_size"] = 96.into();
    std::fs::write(wrong_shape.join("config.json"), config.to_string()).unwrap();

    let foreign_tokenizer = tiny_llama(tmp.path(), "foreign-tokenizer");
    std::fs::write(foreign_tokenizer.join("tokenizer.json"), tokenizer_json(300).to_string()).unwrap();

    let cases: [(&str, &PathBuf, EngineStatus, &[&str]); 5] = [
        ("mamba", &unsupported, EngineStatus::Unsupported, &["'mamba'", "llama"]),
        ("truncated", &truncated, EngineStatus::ModelCorrupt, &["model.safetensors", "corrupt"]),
        ("missing", &missing, EngineStatus::ModelCorrupt, &["model.layers.1.mlp.down_proj.weight", "missing"]),
        ("wrong-shape", &wrong_shape, EngineStatus::ModelCorrupt, &["model.layers.0.mlp.gate_proj.weight", "[96, 64]"]),
        ("foreign-tokenizer", &foreign_tokenizer, EngineStatus::LoadFailed, &["tokenizer.json", "299", "256"]),
    ];
    for (id, dir, status, words) in cases {
        let err = e.load_model(&spec(id, dir)).err().unwrap_or_else(|| panic!("{id} loaded"));
        assert_eq!(err.status, status, "{id}: {}", err.message);
        for w in words {
            assert!(err.message.contains(w), "{id}: {:?} lacks {w:?}", err.message);
        }
    }
    // The good model still answers, as it did before.
    let mut p = InferParams::new(1, "good", "t5 t17 t99", Sampling::greedy());
    p.sampling.max_tokens = Some(4);
    p.ignore_eos = true;
    let res = e.infer(&p, |_| true).unwrap();
    assert_eq!(res.completion_tokens, 4);
}
