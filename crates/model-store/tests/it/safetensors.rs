//! Spec 003's safetensors directory rules, on temporary directories.

use crate::support::small_model;
use llmr_model_store::{Capability, Format, ModelDescriptor, ModelStore, SafetensorsError, StoreError};
use serde_json::json;
use std::path::PathBuf;

struct Fixture {
    _tmp: tempfile::TempDir,
    store: ModelStore,
    dir: PathBuf,
}

/// A store with one model directory `m` holding `files` (name, bytes).
fn fixture(files: &[(&str, &[u8])]) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let store = ModelStore::open(tmp.path().join("models")).unwrap();
    let dir = store.root().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    Fixture { _tmp: tmp, store, dir }
}

fn config(value: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&value).unwrap()
}

fn llama_config() -> Vec<u8> {
    config(json!({ "model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096 }))
}

fn index(shards: &[&str]) -> Vec<u8> {
    let map: serde_json::Map<String, serde_json::Value> =
        shards.iter().enumerate().map(|(i, s)| (format!("layer.{i}.weight"), json!(s))).collect();
    config(json!({ "metadata": { "total_size": 10 }, "weight_map": map }))
}

fn st_error(f: &Fixture) -> SafetensorsError {
    match f.store.resolve("m").unwrap_err() {
        StoreError::Safetensors(e) => e,
        other => panic!("expected a safetensors error, got {other:?}"),
    }
}

fn names(files: &[String]) -> Vec<&str> {
    files.iter().map(String::as_str).collect()
}

#[test]
fn a_single_weights_file_is_the_primary() {
    let cfg = llama_config();
    let f = fixture(&[("config.json", &cfg), ("tokenizer.json", b"{}"), ("model.safetensors", &[0u8; 100])]);
    let d = f.store.resolve("m").unwrap();
    assert_eq!((d.format, d.primary_file.as_path()), (Format::Safetensors, f.dir.join("model.safetensors").as_path()));
    assert_eq!((d.architecture.as_str(), d.context_length, d.quantization.as_deref()), ("llama", Some(4096), None));
    assert_eq!((d.capabilities.as_slice(), d.size_bytes), (&[Capability::Text][..], 100));
    assert_eq!(d.model_dir, f.dir);
}

#[test]
fn an_index_is_the_primary_and_all_its_shards_must_exist() {
    let cfg = llama_config();
    let idx = index(&["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
    let files: [(&str, &[u8]); 5] = [
        ("config.json", &cfg),
        ("tokenizer.json", b"{}"),
        ("model.safetensors.index.json", &idx),
        ("model-00001-of-00002.safetensors", &[0; 10]),
        ("model-00002-of-00002.safetensors", &[0; 20]),
    ];
    let f = fixture(&files);
    let d = f.store.resolve("m").unwrap();
    assert_eq!(d.primary_file, f.dir.join("model.safetensors.index.json"));
    assert_eq!(d.size_bytes, 30);

    let f = fixture(&files[..4]);
    match st_error(&f) {
        SafetensorsError::MissingShards { index, missing } => {
            assert_eq!(index, f.dir.join("model.safetensors.index.json"));
            assert_eq!(missing, ["model-00002-of-00002.safetensors"]);
        }
        other => panic!("{other}"),
    }
}

#[test]
fn several_weights_without_an_index_are_ambiguous() {
    let cfg = llama_config();
    let f =
        fixture(&[("config.json", &cfg), ("tokenizer.json", b"{}"), ("b.safetensors", b"x"), ("a.safetensors", b"x")]);
    let err = st_error(&f);
    let SafetensorsError::Ambiguous { files, .. } = &err else { panic!("{err}") };
    assert_eq!(names(files), ["a.safetensors", "b.safetensors"]);
    assert!(err.to_string().contains("a.safetensors, b.safetensors"), "{err}");
}

#[test]
fn config_and_tokenizer_are_required() {
    let cfg = llama_config();
    let f = fixture(&[("tokenizer.json", b"{}"), ("model.safetensors", b"x")]);
    assert!(matches!(st_error(&f), SafetensorsError::MissingFile { file: "config.json", .. }));
    let f = fixture(&[("config.json", &cfg), ("model.safetensors", b"x")]);
    assert!(matches!(st_error(&f), SafetensorsError::MissingFile { file: "tokenizer.json", .. }));
}

#[test]
fn index_shards_cannot_point_outside_the_directory() {
    let cfg = llama_config();
    let idx = index(&["../../outside.safetensors"]);
    let f = fixture(&[("config.json", &cfg), ("tokenizer.json", b"{}"), ("model.safetensors.index.json", &idx)]);
    assert!(
        matches!(st_error(&f), SafetensorsError::UnsafeShardName { shard, .. } if shard == "../../outside.safetensors")
    );
}

#[test]
fn architecture_falls_back_to_architectures_and_context_to_text_config() {
    let cfg = config(json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": { "max_position_embeddings": 131072 },
        "vision_config": { "hidden_size": 1152 }
    }));
    let f = fixture(&[("config.json", &cfg), ("tokenizer.json", b"{}"), ("model.safetensors", b"x")]);
    let d = f.store.resolve("m").unwrap();
    assert_eq!((d.architecture.as_str(), d.context_length), ("Gemma3ForConditionalGeneration", Some(131072)));
    assert_eq!(d.capabilities, [Capability::Text, Capability::Vision]);

    let cfg = config(json!({ "model_type": "gpt_oss", "max_position_embeddings": 131072 }));
    let f = fixture(&[("config.json", &cfg), ("tokenizer.json", b"{}"), ("model.safetensors", b"x")]);
    assert_eq!(f.store.resolve("m").unwrap().runtime, "GptOssCpp");

    let cfg = config(json!({ "hidden_size": 8 }));
    let f = fixture(&[("config.json", &cfg), ("tokenizer.json", b"{}"), ("model.safetensors", b"x")]);
    assert!(matches!(st_error(&f), SafetensorsError::MissingArchitecture { .. }));

    let f = fixture(&[("config.json", b"{not json"), ("tokenizer.json", b"{}"), ("model.safetensors", b"x")]);
    assert!(matches!(st_error(&f), SafetensorsError::Json { path, .. } if path.ends_with("config.json")));
}

#[test]
fn safetensors_models_take_no_quantization_tag() {
    let cfg = llama_config();
    let f = fixture(&[("config.json", &cfg), ("tokenizer.json", b"{}"), ("model.safetensors", b"x")]);
    assert!(matches!(
        f.store.resolve("m:Q4_K_M").unwrap_err(),
        StoreError::TagOnNonGguf { format: Format::Safetensors, .. }
    ));
}

#[test]
fn gguf_beside_safetensors_needs_a_tag() {
    let cfg = llama_config();
    let gguf = small_model("llama", 7, 8).build();
    let f = fixture(&[
        ("config.json", &cfg),
        ("tokenizer.json", b"{}"),
        ("model.safetensors", b"x"),
        ("model-Q8_0.gguf", &gguf),
    ]);
    let err = f.store.resolve("m").unwrap_err();
    assert!(matches!(&err, StoreError::MixedFormats { gguf, .. } if names(gguf) == ["model-Q8_0.gguf"]), "{err}");
    let d = f.store.resolve("m:Q8_0").unwrap();
    assert_eq!((d.format, d.name.as_str()), (Format::Gguf, "m:Q8_0"));
    assert_eq!(names(&f.store.list().into_iter().map(|d| d.name).collect::<Vec<_>>()), ["m:Q8_0"]);
}

#[test]
fn a_safetensors_model_described_from_a_list_of_files() {
    let cfg = llama_config();
    let f = fixture(&[("config.json", &cfg), ("tokenizer.json", b"{}"), ("model.safetensors", &[0u8; 100])]);
    let files = ["config.json", "tokenizer.json", "model.safetensors"];
    let d = ModelDescriptor::from_files("m".into(), &f.dir, "model.safetensors", &files).unwrap();
    assert_eq!(
        (d.format, d.primary_file.clone(), d.size_bytes),
        (Format::Safetensors, f.dir.join("model.safetensors"), 100)
    );
    // A listing without the tokenizer breaks the rules, whatever the directory holds.
    let without = ["config.json", "model.safetensors"];
    let err = ModelDescriptor::from_files("m".into(), &f.dir, "model.safetensors", &without).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json is missing"), "{err}");
}
