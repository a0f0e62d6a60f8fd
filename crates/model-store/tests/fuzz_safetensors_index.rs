//! Fuzzing the model store's reading of a safetensors model directory (issue 16): the sharded
//! index (`model.safetensors.index.json`, whose shard names must stay in the directory) and
//! `config.json`, both downloaded from a hub and so untrusted. Seeds: `tests/fuzz-seeds/
//! safetensors-index/` and `safetensors-config/`, mutated as JSON documents (values of the wrong
//! type, odd and path-like strings, deep nesting, numbers out of range) and as bytes.
//! Property: `ModelDescriptor::from_path`, `ModelStore::resolve`/`list` and
//! `ModelDescriptor::from_files` return Ok or a `StoreError`, never panic or hang, and a
//! descriptor they return names files inside the model directory.
//!
//! `LLMR_FUZZ_CASES=N` or `LLMR_FUZZ_SECS=S` for longer runs (`scripts/fuzz`).

#[path = "../../../tests/fuzz/harness.rs"]
mod harness;

use harness::{fuzz, json_inputs, load_seeds, note, variant, watch};
use llmr_model_store::{Format, ModelDescriptor, ModelStore, StoreError};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const INDEX: &str = "model.safetensors.index.json";
const SHARDS: [&str; 2] = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];

fn seeds(kind: &str) -> Arc<Vec<Vec<u8>>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-seeds").join(kind);
    Arc::new(load_seeds(&dir).into_iter().map(|(_, bytes)| bytes).collect())
}

#[derive(Clone, Copy, Debug)]
enum File {
    Index,
    Config,
}

/// A model directory `root/m` holding the two shards, `tokenizer.json`, and the index and
/// config: one of them is the fuzzed input, the other the first seed.
struct ModelDir {
    root: tempfile::TempDir,
    index: Vec<u8>,
    config: Vec<u8>,
}

impl ModelDir {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("m");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), br#"{"model": {"type": "BPE"}}"#).unwrap();
        for shard in SHARDS {
            std::fs::write(dir.join(shard), b"\x02\0\0\0\0\0\0\0{}").unwrap();
        }
        Self { root, index: seeds("safetensors-index")[0].clone(), config: seeds("safetensors-config")[0].clone() }
    }

    fn dir(&self) -> PathBuf {
        self.root.path().join("m")
    }

    fn check(&self, file: File, bytes: &[u8]) -> Result<(), TestCaseError> {
        let dir = self.dir();
        let (index, config) = match file {
            File::Index => (bytes, &self.config[..]),
            File::Config => (&self.index[..], bytes),
        };
        std::fs::write(dir.join(INDEX), index).unwrap();
        std::fs::write(dir.join("config.json"), config).unwrap();

        let described = watch(bytes, || ModelDescriptor::from_path(&dir));
        match &described {
            Ok(d) => {
                prop_assert_eq!(d.format, Format::Safetensors);
                prop_assert_eq!(&d.primary_file, &dir.join(INDEX));
                prop_assert!(d.primary_file.starts_with(&dir));
            }
            Err(e) => {
                let _ = e.to_string();
                note(&match e {
                    StoreError::Safetensors(inner) => variant(inner),
                    other => variant(other),
                });
            }
        }
        if described.is_ok() {
            note("ok");
        }
        let store = ModelStore::open(self.root.path()).unwrap();
        let resolved = watch(bytes, || store.resolve("m"));
        prop_assert_eq!(resolved.is_ok(), described.is_ok(), "resolve and from_path agree: {:?}", resolved.err());
        let listed = watch(bytes, || store.list());
        prop_assert_eq!(listed.len(), usize::from(described.is_ok()));
        // A router manifest's way in: the same files, listed.
        let files = ["config.json", "tokenizer.json", INDEX, SHARDS[0], SHARDS[1]];
        let from_files = watch(bytes, || ModelDescriptor::from_files("m".into(), &dir, INDEX, &files));
        prop_assert_eq!(
            from_files.is_ok(),
            described.is_ok(),
            "from_files and from_path agree: {:?}",
            from_files.err()
        );
        Ok(())
    }
}

fn inputs() -> impl Strategy<Value = (File, Vec<u8>)> {
    prop_oneof![
        json_inputs(seeds("safetensors-index")).prop_map(|b| (File::Index, b)),
        json_inputs(seeds("safetensors-config")).prop_map(|b| (File::Config, b)),
    ]
}

#[test]
fn seeds_are_valid() {
    let model = ModelDir::new();
    for (file, kind) in [(File::Index, "safetensors-index"), (File::Config, "safetensors-config")] {
        for bytes in seeds(kind).iter() {
            model.check(file, bytes).unwrap();
            ModelDescriptor::from_path(&model.dir()).unwrap_or_else(|e| panic!("a {kind} seed: {e}"));
        }
    }
}

#[test]
fn fuzz_safetensors_index_and_config() {
    let model = ModelDir::new();
    fuzz("store-safetensors-dir", 1000, inputs(), |(file, bytes)| model.check(file, &bytes));
}
