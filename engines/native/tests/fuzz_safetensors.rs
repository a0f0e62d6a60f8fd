//! Fuzzing the native engine's checkpoint reader (issue 16: untrusted files never crash
//! anything): the safetensors header (a length, then JSON naming each tensor's dtype, shape and
//! byte range) and the sharded index (`model.safetensors.index.json`, whose shard names must
//! stay in the model's folder). Inputs: the committed seeds of `tests/fuzz-seeds/safetensors/`
//! (made by the writer below) mutated as bytes; safetensors files generated from random tensor
//! lists whose header JSON is then mutated as a document (wrong types, huge numbers, deep
//! nesting) and whose header length and payload may lie; indexes mutated as JSON.
//! Property: `Checkpoint::open` returns Ok or a `CheckpointError` without panicking, hanging or
//! allocating without bound, and every tensor of a checkpoint it accepts can be taken (`get`,
//! `get_bytes`) and read (`bytes`, `to_f32`) without panicking.
//!
//! `LLMR_FUZZ_CASES=N` or `LLMR_FUZZ_SECS=S` for longer runs (`scripts/fuzz`);
//! `LLMR_FUZZ_WRITE_SEEDS=1` rewrites the seed files from the generators here.

#[path = "../../../tests/fuzz/harness.rs"]
mod harness;

use harness::{apply, apply_json, check_seed, fuzz, interesting_u64, json_inputs, json_op, load_seeds};
use harness::{maybe_mutations, mutated, Seeds};
use harness::{noise, note, odd_string, to_text, variant, watch};
use llmr_native_engine::checkpoint::{Checkpoint, CheckpointError};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const INDEX: &str = "model.safetensors.index.json";
const SHARDS: [&str; 2] = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];

fn seed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-seeds/safetensors")
}

// ---- a safetensors writer ----

#[derive(Clone, Debug)]
struct Spec {
    name: String,
    dtype: String,
    shape: Vec<usize>,
}

fn dtype_size(dtype: &str) -> usize {
    match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        _ => 1,
    }
}

/// The header (as a document, to be mutated) and the payload length of a valid file.
fn header(specs: &[Spec], metadata: bool) -> (Value, usize) {
    let mut map = Map::new();
    if metadata {
        map.insert("__metadata__".into(), json!({"format": "pt"}));
    }
    let mut offset = 0;
    for spec in specs {
        let len = spec.shape.iter().product::<usize>() * dtype_size(&spec.dtype);
        let entry = json!({"dtype": spec.dtype, "shape": spec.shape, "data_offsets": [offset, offset + len]});
        map.insert(spec.name.clone(), entry);
        offset += len;
    }
    (Value::Object(map), offset)
}

/// A file: 8-byte header length, the header text padded with spaces, the payload (a pattern, so
/// that values differ).
fn file(header_text: &str, pad: usize, payload: usize) -> Vec<u8> {
    let header_len = header_text.len() + pad;
    let mut bytes = (header_len as u64).to_le_bytes().to_vec();
    bytes.extend(header_text.as_bytes());
    bytes.extend(std::iter::repeat_n(b' ', pad));
    bytes.extend((0..payload).map(|i| (i * 37 % 251) as u8));
    bytes
}

fn spec(name: &str, dtype: &str, shape: &[usize]) -> Spec {
    Spec { name: name.into(), dtype: dtype.into(), shape: shape.to_vec() }
}

fn valid(specs: &[Spec]) -> Vec<u8> {
    let (h, payload) = header(specs, true);
    let text = serde_json::to_string(&h).unwrap();
    // Real writers pad the header to 8 bytes.
    file(&text, (8 - text.len() % 8) % 8, payload)
}

fn seed_specs() -> Vec<Spec> {
    vec![
        spec("model.embed_tokens.weight", "BF16", &[8, 4]),
        spec("model.layers.0.self_attn.q_proj.weight", "F16", &[4, 4]),
        spec("model.norm.weight", "F32", &[4]),
        spec("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", &[2, 16]),
        spec("lm_head.weight", "BF16", &[8, 4]),
    ]
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let specs = seed_specs();
    let index = json!({
        "metadata": {"total_size": 256},
        "weight_map": specs.iter().enumerate().map(|(i, s)| (s.name.clone(), json!(SHARDS[usize::from(i >= 2)]))).collect::<Map<_, _>>(),
    });
    vec![
        (SHARDS[0], valid(&specs[..2])),
        (SHARDS[1], valid(&specs[2..])),
        (INDEX, serde_json::to_vec_pretty(&index).unwrap()),
        ("model.safetensors", valid(&specs)),
    ]
}

/// The committed seeds: (safetensors files, index files).
fn committed() -> (Seeds, Seeds) {
    let (mut files, mut indexes) = (Vec::new(), Vec::new());
    for (name, bytes) in load_seeds(&seed_dir()) {
        let pool = if name.ends_with(".index.json") { &mut indexes } else { &mut files };
        pool.push(bytes);
    }
    (Arc::new(files), Arc::new(indexes))
}

// ---- structured generation ----

fn spec_strategy() -> impl Strategy<Value = Spec> {
    let dtype = prop_oneof![
        8 => prop::sample::select(vec!["F32", "F16", "BF16", "U8"]),
        2 => prop::sample::select(vec!["I64", "F64", "BOOL", "I8", "I32", "U16", "F8_E4M3", "F8_E5M2", "F4", "C64"]),
        1 => prop::sample::select(vec!["", "f32", "Q4_0", "F32 "]),
    ];
    let name = prop_oneof![
        3 => prop::sample::select(seed_specs().into_iter().map(|s| s.name).collect::<Vec<_>>()),
        1 => odd_string(),
    ];
    (name, dtype, prop::collection::vec(0usize..9, 0..4)).prop_map(|(name, dtype, shape)| Spec {
        name,
        dtype: dtype.to_string(),
        shape,
    })
}

/// A file from random tensors whose header document gets mutated, whose header length and
/// payload length may lie, and whose bytes may change.
fn structured() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(spec_strategy(), 0..5),
        any::<bool>(),
        prop_oneof![2 => Just(Vec::new()), 2 => prop::collection::vec(json_op(), 1..2), 1 => prop::collection::vec(json_op(), 2..4)],
        0usize..9,
        prop::option::weighted(0.15, interesting_u64()),
        prop::option::weighted(0.15, -64i64..64),
        maybe_mutations(),
    )
        .prop_map(|(specs, metadata, ops, pad, header_lie, payload_delta, byte_ops)| {
            let (mut h, payload) = header(&specs, metadata);
            for op in &ops {
                apply_json(&mut h, op);
            }
            let text = to_text(&h, false);
            let payload = payload.saturating_add_signed(payload_delta.unwrap_or(0) as isize);
            let mut bytes = file(&text, pad, payload.min(1 << 20));
            if let Some(lie) = header_lie {
                bytes[..8].copy_from_slice(&lie.to_le_bytes());
            }
            for m in &byte_ops {
                apply(&mut bytes, m, &[]);
            }
            bytes
        })
}

#[derive(Clone, Debug)]
enum Input {
    Single(Vec<u8>),
    /// An index, and maybe one shard replaced.
    Sharded(Vec<u8>, Option<(Index, Vec<u8>)>),
}

impl Input {
    /// The bytes the watchdog writes out if the case hangs.
    fn bytes(&self) -> Vec<u8> {
        match self {
            Input::Single(b) => b.clone(),
            Input::Sharded(index, shard) => {
                let mut b = index.clone();
                if let Some((_, s)) = shard {
                    b.extend(b"\n--- shard ---\n");
                    b.extend(s);
                }
                b
            }
        }
    }
}

// ---- the property ----

/// (name, shape) of every tensor the header of `bytes` declares, as far as it can be read.
fn declared(bytes: &[u8]) -> Vec<(String, Vec<usize>)> {
    let Some(len) = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap())) else { return vec![] };
    let Some(text) = usize::try_from(len).ok().and_then(|len| bytes.get(8..8usize.checked_add(len)?)) else {
        return vec![];
    };
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(text) else { return vec![] };
    map.into_iter()
        .filter_map(|(name, v)| {
            let shape =
                v.get("shape")?.as_array()?.iter().map(|d| d.as_u64().map(|d| d as usize)).collect::<Option<_>>()?;
            Some((name, shape))
        })
        .collect()
}

/// Opens `primary` and takes and reads every tensor `files` declare.
fn open_and_read(primary: &Path, files: &[&[u8]]) -> Result<(), TestCaseError> {
    let checkpoint = match Checkpoint::open(primary) {
        Ok(checkpoint) => checkpoint,
        Err(e) => {
            let _ = e.to_string();
            note(&match &e {
                CheckpointError::Corrupt { message, .. } => {
                    format!("Corrupt: {}", message.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                }
                other => variant(other),
            });
            return Ok(());
        }
    };
    note("ok");
    let _ = checkpoint.mapped_bytes();
    for (name, shape) in files.iter().flat_map(|f| declared(f)) {
        if !checkpoint.contains(&name) {
            continue;
        }
        if let Ok(view) = checkpoint.get(&name, &shape) {
            let expected = shape.iter().product::<usize>() * view.dtype.size();
            prop_assert_eq!(view.bytes().len(), expected, "{}", name);
            prop_assert_eq!(view.to_f32().len(), shape.iter().product::<usize>());
        }
        if let Ok(bytes) = checkpoint.get_bytes(&name, &shape) {
            prop_assert_eq!(bytes.bytes().len(), shape.iter().product::<usize>());
        }
        // A shape the config could ask for that the file does not have.
        let _ = checkpoint.get(&name, &[1, 2, 3]).map(|v| v.bytes().len());
    }
    let _ = checkpoint.get("no.such.tensor", &[1]).err().map(|e| e.to_string());
    Ok(())
}

struct Folder {
    dir: tempfile::TempDir,
    shards: Vec<Vec<u8>>,
}

impl Folder {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let shards = SHARDS.iter().map(|s| std::fs::read(seed_dir().join(s)).unwrap()).collect();
        Self { dir, shards }
    }

    fn check(&self, input: &Input) -> Result<(), TestCaseError> {
        let dir = self.dir.path();
        let dump = input.bytes();
        match input {
            Input::Single(bytes) => {
                let path = dir.join("model.safetensors");
                std::fs::write(&path, bytes).unwrap();
                watch(&dump, || open_and_read(&path, &[bytes.as_slice()]))
            }
            Input::Sharded(index, replaced) => {
                let mut shards = self.shards.clone();
                if let Some((which, bytes)) = replaced {
                    shards[which.index(SHARDS.len())] = bytes.clone();
                }
                for (name, bytes) in SHARDS.iter().zip(&shards) {
                    std::fs::write(dir.join(name), bytes).unwrap();
                }
                let path = dir.join(INDEX);
                std::fs::write(&path, index).unwrap();
                let files: Vec<&[u8]> = shards.iter().map(Vec::as_slice).collect();
                watch(&dump, || open_and_read(&path, &files))
            }
        }
    }
}

#[test]
fn seeds_are_committed_and_valid() {
    for (name, bytes) in seeds() {
        check_seed(&seed_dir(), name, &bytes);
    }
    let folder = Folder::new();
    for (name, bytes) in seeds() {
        let path = folder.dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
    }
    for primary in ["model.safetensors", INDEX] {
        let checkpoint =
            Checkpoint::open(&folder.dir.path().join(primary)).unwrap_or_else(|e| panic!("{primary}: {e}"));
        for s in seed_specs() {
            assert!(checkpoint.contains(&s.name), "{primary}: {}", s.name);
        }
        assert_eq!(checkpoint.get("model.norm.weight", &[4]).unwrap().to_f32().len(), 4);
        assert_eq!(
            checkpoint.get_bytes("model.layers.0.mlp.experts.gate_up_proj_blocks", &[2, 16]).unwrap().bytes().len(),
            32
        );
    }
}

#[test]
fn fuzz_safetensors_files() {
    let folder = Folder::new();
    let (files, _) = committed();
    let strategy = prop_oneof![
        3 => mutated(files).prop_map(Input::Single),
        6 => structured().prop_map(Input::Single),
        1 => noise(b"\x40\0\0\0\0\0\0\0{\"").prop_map(Input::Single),
    ];
    fuzz("checkpoint-header", 3000, strategy, |input| folder.check(&input));
}

#[test]
fn fuzz_safetensors_index() {
    let folder = Folder::new();
    let (files, indexes) = committed();
    let shard = prop::option::weighted(0.3, (any::<Index>(), mutated(files)));
    let strategy = (json_inputs(indexes), shard).prop_map(|(index, shard)| Input::Sharded(index, shard));
    fuzz("checkpoint-index", 2000, strategy, |input| folder.check(&input));
}
