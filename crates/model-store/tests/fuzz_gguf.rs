//! Fuzzing the GGUF header reader (issue 16: untrusted files never crash anything): committed
//! seed files (`tests/fuzz-seeds/gguf/`, made by the writer below) mutated byte by byte, and
//! files generated from a random structure whose length and count fields may lie (2^60, u64::MAX,
//! off by one). Property: `GgufHeader::read_from` returns (Ok or a `GgufError`) within the
//! watchdog's time without panicking or allocating without bound, and a header it accepts
//! answers every accessor, reads every array element on demand and makes a `ModelDescriptor`
//! without panicking either.
//!
//! `LLMR_FUZZ_CASES=N` or `LLMR_FUZZ_SECS=S` for longer runs (`scripts/fuzz`);
//! `LLMR_FUZZ_WRITE_SEEDS=1` rewrites the seed files from the generators here.

#[path = "../../../tests/fuzz/harness.rs"]
mod harness;

use harness::{
    apply, check_seed, fuzz, interesting_u64, load_seeds, maybe_mutations, mutated, noise, note, odd_string,
};
use harness::{variant, watch};
use llmr_model_store::gguf::{GgufHeader, GgufValue};
use llmr_model_store::ModelDescriptor;
use proptest::prelude::*;
use proptest::sample::Index;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn seed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-seeds/gguf")
}

// ---- a GGUF writer that records where its lengths and counts are ----

/// A metadata value; `Arr` holds its element type id, and its items may be of another type (a
/// lying file).
#[derive(Clone, Debug)]
enum Val {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    /// The raw byte: 0 and 1 are valid.
    Bool(u8),
    Str(Vec<u8>),
    Arr(u32, Vec<Val>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Val {
    fn type_id(&self) -> u32 {
        match self {
            Val::U8(_) => 0,
            Val::I8(_) => 1,
            Val::U16(_) => 2,
            Val::I16(_) => 3,
            Val::U32(_) => 4,
            Val::I32(_) => 5,
            Val::F32(_) => 6,
            Val::Bool(_) => 7,
            Val::Str(_) => 8,
            Val::Arr(..) => 9,
            Val::U64(_) => 10,
            Val::I64(_) => 11,
            Val::F64(_) => 12,
        }
    }
}

fn s(text: &str) -> Val {
    Val::Str(text.as_bytes().to_vec())
}

#[derive(Clone, Debug)]
struct Tensor {
    name: Vec<u8>,
    dims: Vec<u64>,
    ggml_type: u32,
    /// `None`: the next aligned offset after the previous tensor.
    offset: Option<u64>,
}

#[derive(Clone, Debug)]
struct Gguf {
    version: u32,
    /// Key, the type id written (`None`: the value's own), value.
    kvs: Vec<(Vec<u8>, Option<u32>, Val)>,
    tensors: Vec<Tensor>,
    /// Bytes of tensor data after the aligned end of the tensor infos; `None`: what the tensors
    /// need.
    data_len: Option<u64>,
}

/// (elements per block, bytes per block) of the types the writer sizes.
fn block(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (1, 4),
        1 | 30 => (1, 2),
        2 => (32, 18),
        8 => (32, 34),
        12 => (256, 144),
        24 => (1, 1),
        _ => return None,
    })
}

struct Writer {
    out: Vec<u8>,
    /// Offsets of every u64 length or count written.
    lengths: Vec<usize>,
}

impl Writer {
    fn count(&mut self, n: u64) {
        self.lengths.push(self.out.len());
        self.out.extend(n.to_le_bytes());
    }

    fn str(&mut self, bytes: &[u8]) {
        self.count(bytes.len() as u64);
        self.out.extend(bytes);
    }

    fn val(&mut self, v: &Val) {
        match v {
            Val::U8(x) => self.out.push(*x),
            Val::I8(x) => self.out.extend(x.to_le_bytes()),
            Val::U16(x) => self.out.extend(x.to_le_bytes()),
            Val::I16(x) => self.out.extend(x.to_le_bytes()),
            Val::U32(x) => self.out.extend(x.to_le_bytes()),
            Val::I32(x) => self.out.extend(x.to_le_bytes()),
            Val::F32(x) => self.out.extend(x.to_le_bytes()),
            Val::Bool(x) => self.out.push(*x),
            Val::Str(x) => self.str(x),
            Val::Arr(elem, items) => {
                self.out.extend(elem.to_le_bytes());
                self.count(items.len() as u64);
                items.iter().for_each(|item| self.val(item));
            }
            Val::U64(x) => self.out.extend(x.to_le_bytes()),
            Val::I64(x) => self.out.extend(x.to_le_bytes()),
            Val::F64(x) => self.out.extend(x.to_le_bytes()),
        }
    }
}

impl Gguf {
    fn alignment(&self) -> u64 {
        let declared = self.kvs.iter().find(|(k, _, _)| k == b"general.alignment").and_then(|(_, _, v)| match v {
            Val::U32(a) => Some(u64::from(*a)),
            Val::U64(a) => Some(*a),
            _ => None,
        });
        // A huge declared alignment would make the writer pad for ever; the file just lies then.
        declared.filter(|a| a.is_power_of_two() && *a <= 4096).unwrap_or(32)
    }

    /// The file and the offsets of its length and count fields.
    fn build(&self) -> (Vec<u8>, Vec<usize>) {
        let align = self.alignment();
        let mut w = Writer { out: b"GGUF".to_vec(), lengths: Vec::new() };
        w.out.extend(self.version.to_le_bytes());
        w.count(self.tensors.len() as u64);
        w.count(self.kvs.len() as u64);
        for (key, ty, value) in &self.kvs {
            w.str(key);
            w.out.extend(ty.unwrap_or(value.type_id()).to_le_bytes());
            w.val(value);
        }
        let mut next = 0u64;
        for t in &self.tensors {
            w.str(&t.name);
            w.out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                w.count(*d);
            }
            w.out.extend(t.ggml_type.to_le_bytes());
            let offset = t.offset.unwrap_or(next);
            w.count(offset);
            let size = block(t.ggml_type)
                .and_then(|(elems, bytes)| {
                    t.dims.iter().try_fold(1u64, |a, d| a.checked_mul(*d)).and_then(|n| (n / elems).checked_mul(bytes))
                })
                .unwrap_or(0);
            next = offset.saturating_add(size).div_ceil(align).saturating_mul(align);
        }
        let data_start = (w.out.len() as u64).div_ceil(align) * align;
        w.out.resize(data_start as usize, 0);
        let needed = self.tensors.last().map_or(0, |_| next);
        let data = self.data_len.unwrap_or(needed).min(1 << 20);
        w.out.resize(w.out.len() + data as usize, 0);
        (w.out, w.lengths)
    }
}

// ---- the seeds ----

fn tokens(n: usize) -> Val {
    Val::Arr(8, (0..n).map(|i| Val::Str(format!("tok{i}").into_bytes())).collect())
}

fn kv(key: &str, value: Val) -> (Vec<u8>, Option<u32>, Val) {
    (key.as_bytes().to_vec(), None, value)
}

fn tensor(name: &str, dims: &[u64], ggml_type: u32) -> Tensor {
    Tensor { name: name.as_bytes().to_vec(), dims: dims.to_vec(), ggml_type, offset: None }
}

/// A small llama with every value type, nested arrays and three tensors (F32, Q4_K, F16).
fn llama_seed() -> Gguf {
    Gguf {
        version: 3,
        kvs: vec![
            kv("general.architecture", s("llama")),
            kv("general.name", s("Fuzz Seed Llama")),
            kv("general.file_type", Val::U32(15)),
            kv("general.alignment", Val::U32(32)),
            kv("llama.context_length", Val::U32(4096)),
            kv("llama.embedding_length", Val::U64(64)),
            kv("llama.block_count", Val::U32(1)),
            kv("llama.rope.freq_base", Val::F32(10000.0)),
            kv("llama.attention.layer_norm_rms_epsilon", Val::F64(1e-5)),
            kv("llama.attention.head_count", Val::Arr(4, vec![Val::U32(4)])),
            kv("general.quantized_by", Val::U8(7)),
            kv("general.i8", Val::I8(-3)),
            kv("general.u16", Val::U16(65_000)),
            kv("general.i16", Val::I16(-300)),
            kv("general.i32", Val::I32(-70_000)),
            kv("general.i64", Val::I64(i64::MIN)),
            kv("general.flag", Val::Bool(1)),
            kv(
                "general.nested",
                Val::Arr(9, vec![Val::Arr(4, vec![Val::U32(1), Val::U32(2)]), Val::Arr(8, vec![s("a")])]),
            ),
            kv("tokenizer.chat_template", s("{% for m in messages %}{{ m.content }}{% endfor %}")),
            kv("tokenizer.ggml.model", s("gpt2")),
            kv("tokenizer.ggml.tokens", tokens(8)),
            kv("tokenizer.ggml.scores", Val::Arr(6, (0..8).map(|i| Val::F32(i as f32)).collect())),
            kv("tokenizer.ggml.token_type", Val::Arr(5, (0..8).map(Val::I32).collect())),
            kv("tokenizer.ggml.bos_token_id", Val::U32(1)),
            kv("tokenizer.ggml.eos_token_id", Val::U32(2)),
        ],
        tensors: vec![
            tensor("token_embd.weight", &[64, 8], 0),
            tensor("blk.0.attn_q.weight", &[256, 2], 12),
            tensor("output_norm.weight", &[64], 1),
        ],
        data_len: None,
    }
}

/// An encoder embedding model in GGUF v2: pooling, non-causal attention, u64 counts.
fn bert_seed() -> Gguf {
    Gguf {
        version: 2,
        kvs: vec![
            kv("general.architecture", s("bert")),
            kv("general.file_type", Val::U32(1)),
            kv("bert.context_length", Val::U64(512)),
            kv("bert.pooling_type", Val::U32(1)),
            kv("bert.attention.causal", Val::Bool(0)),
            kv("tokenizer.ggml.tokens", tokens(16)),
            kv("tokenizer.ggml.bos_token_id", Val::U32(0)),
            kv("tokenizer.ggml.eos_token_id", Val::U32(15)),
        ],
        tensors: vec![tensor("token_embd.weight", &[32, 16], 1)],
        data_len: None,
    }
}

/// A vocabulary past `INLINE_ARRAY_MAX`, so arrays are read on demand; special tokens inside
/// and outside it; 64-byte alignment; no tensors.
fn long_vocab_seed() -> Gguf {
    Gguf {
        version: 3,
        kvs: vec![
            kv("general.architecture", s("gemma3")),
            kv("general.alignment", Val::U64(64)),
            kv("tokenizer.ggml.tokens", tokens(1100)),
            kv("tokenizer.ggml.scores", Val::Arr(6, (0..1100).map(|i| Val::F32(i as f32)).collect())),
            kv("tokenizer.ggml.bos_token_id", Val::U32(1099)),
            kv("tokenizer.ggml.eos_token_id", Val::U64(5000)),
        ],
        tensors: vec![],
        data_len: Some(0),
    }
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("bert-embedding-v2.gguf", bert_seed().build().0),
        ("llama-q4_k_m.gguf", llama_seed().build().0),
        ("long-vocab.gguf", long_vocab_seed().build().0),
    ]
}

// ---- structured generation ----

const KEYS: &[&str] = &[
    "general.architecture",
    "general.name",
    "general.alignment",
    "general.file_type",
    "llama.context_length",
    "llama.embedding_length",
    "llama.block_count",
    "llama.pooling_type",
    "llama.attention.causal",
    "bert.pooling_type",
    "bert.attention.causal",
    "tokenizer.chat_template",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
];

fn scalar_of(t: u32) -> BoxedStrategy<Val> {
    match t {
        0 => any::<u8>().prop_map(Val::U8).boxed(),
        1 => any::<i8>().prop_map(Val::I8).boxed(),
        2 => any::<u16>().prop_map(Val::U16).boxed(),
        3 => any::<i16>().prop_map(Val::I16).boxed(),
        4 => prop_oneof![0u32..64, any::<u32>()].prop_map(Val::U32).boxed(),
        5 => any::<i32>().prop_map(Val::I32).boxed(),
        6 => any::<f32>().prop_map(Val::F32).boxed(),
        7 => prop_oneof![12 => 0u8..2, 1 => any::<u8>()].prop_map(Val::Bool).boxed(),
        10 => interesting_u64().prop_map(Val::U64).boxed(),
        11 => any::<i64>().prop_map(Val::I64).boxed(),
        12 => any::<f64>().prop_map(Val::F64).boxed(),
        _ => prop_oneof![
            20 => odd_string().prop_map(|s| Val::Str(s.into_bytes())),
            1 => prop::collection::vec(any::<u8>(), 0..16).prop_map(Val::Str),
        ]
        .boxed(),
    }
}

fn scalar_type() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![0u32, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12])
}

fn value() -> impl Strategy<Value = Val> {
    let scalar = scalar_type().prop_flat_map(scalar_of);
    scalar.prop_recursive(3, 48, 8, |inner| {
        prop_oneof![
            3 => scalar_type()
                .prop_flat_map(|t| prop::collection::vec(scalar_of(t), 0..10).prop_map(move |items| Val::Arr(t, items))),
            1 => prop::collection::vec(inner, 0..4).prop_map(|items| {
                let arrays = items
                    .into_iter()
                    .map(|x| if matches!(x, Val::Arr(..)) { x } else { Val::Arr(x.type_id(), vec![x]) })
                    .collect();
                Val::Arr(9, arrays)
            }),
            1 => (1020usize..1200).prop_map(tokens),
        ]
    })
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => prop::sample::select(KEYS).prop_map(|k| k.as_bytes().to_vec()),
        6 => odd_string().prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..12),
    ]
}

fn tensor_strategy() -> impl Strategy<Value = Tensor> {
    let known = prop::sample::select(vec![0u32, 1, 2, 8, 12, 24, 30]);
    let dims = prop::collection::vec(prop_oneof![8 => 1u64..5, 1 => interesting_u64()], 0..6);
    (
        odd_string(),
        dims,
        prop_oneof![6 => known, 1 => 0u32..48, 1 => any::<u32>()],
        prop::option::weighted(0.15, interesting_u64()),
    )
        .prop_map(|(name, mut dims, ggml_type, offset)| {
            // Mostly whole blocks, so that the sizes add up and the reader gets to the end.
            if let (Some((elems, _)), Some(first)) = (block(ggml_type), dims.first_mut()) {
                if *first < 1 << 32 {
                    *first *= elems;
                }
            }
            Tensor { name: name.into_bytes(), dims, ggml_type, offset }
        })
}

/// A GGUF from a random structure; then some of its length and count fields lie, and a few bytes
/// change.
fn structured() -> impl Strategy<Value = Vec<u8>> {
    let version = prop_oneof![16 => Just(3u32), 4 => Just(2u32), 1 => Just(0x0300_0000u32), 1 => any::<u32>()];
    let kvs = prop::collection::vec((key(), prop::option::weighted(0.05, 0u32..16), value()), 0..10);
    let arch = prop::option::weighted(
        0.8,
        prop::sample::select(vec!["llama", "bert", "gemma3", "qwen2", "nomic-bert", "", "é"]),
    );
    (
        version,
        arch,
        kvs,
        prop::collection::vec(tensor_strategy(), 0..4),
        prop::option::weighted(0.2, 0u64..8192),
        prop_oneof![3 => Just(Vec::new()), 2 => prop::collection::vec((any::<Index>(), interesting_u64()), 1..3)],
        maybe_mutations(),
    )
        .prop_map(|(version, arch, mut kvs, tensors, data_len, lies, byte_ops)| {
            if let Some(arch) = arch {
                kvs.insert(0, kv("general.architecture", s(arch)));
            }
            let (mut bytes, lengths) = Gguf { version, kvs, tensors, data_len }.build();
            for (i, value) in &lies {
                let p = lengths[harness::at(i, lengths.len())];
                bytes[p..p + 8].copy_from_slice(&value.to_le_bytes());
            }
            for m in &byte_ops {
                apply(&mut bytes, m, &[]);
            }
            bytes
        })
}

// ---- the property ----

/// Every accessor, and every array element read on demand near the ends and past them.
fn exercise(h: &GgufHeader, bytes: &[u8]) -> Result<(), TestCaseError> {
    let _ = (h.architecture(), h.name(), h.context_length(), h.embedding_length(), h.block_count());
    let _ = (h.chat_template(), h.bos_token_id(), h.eos_token_id(), h.bos_token(), h.eos_token());
    let _ = (h.pooling_type(), h.causal_attention(), h.file_type(), h.quantization());
    for value in h.metadata.values() {
        let _ = (value.as_u64(), value.as_i64(), value.as_f64(), value.as_bool(), value.as_str(), value.value_type());
        let Some(array) = value.as_array() else { continue };
        if let Some(values) = array.values() {
            prop_assert_eq!(values.len() as u64, array.len, "a loaded array holds its declared length");
        }
        let len = array.len;
        for index in [0, len / 2, len.saturating_sub(1), len, len.saturating_add(1), u64::MAX] {
            let element = array.read_element(Cursor::new(bytes), index);
            if index >= len {
                prop_assert!(matches!(element, Ok(None)), "element {index} of {len}: {element:?}");
            }
        }
    }
    Ok(())
}

fn check(bytes: &[u8], dir: &Path) -> Result<(), TestCaseError> {
    let header = watch(bytes, || GgufHeader::read_from(Cursor::new(bytes)));
    let header = match header {
        Ok(header) => header,
        Err(error) => {
            let _ = (error.to_string(), error.kind(), error.is_corrupt());
            note(&variant(&error));
            return Ok(());
        }
    };
    note("ok");
    prop_assert!(header.data_offset <= bytes.len() as u64, "data offset {} past the end", header.data_offset);
    watch(bytes, || exercise(&header, bytes))?;
    // The store's way in: the same bytes as a file.
    let path = dir.join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    match watch(bytes, || ModelDescriptor::from_gguf_file(&path)) {
        Ok(d) => prop_assert_eq!(Some(d.architecture.as_str()), header.architecture()),
        Err(error) => {
            let _ = error.to_string();
        }
    }
    Ok(())
}

fn committed_seeds() -> Arc<Vec<Vec<u8>>> {
    Arc::new(load_seeds(&seed_dir()).into_iter().map(|(_, bytes)| bytes).collect())
}

#[test]
fn seeds_are_committed_and_valid() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in seeds() {
        check_seed(&seed_dir(), name, &bytes);
        let header = GgufHeader::read_from(Cursor::new(&bytes)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(header.architecture().is_some(), "{name}");
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        ModelDescriptor::from_gguf_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        check(&bytes, dir.path()).unwrap();
    }
    let long = GgufHeader::read_from(Cursor::new(long_vocab_seed().build().0)).unwrap();
    assert_eq!((long.bos_token(), long.eos_token_id(), long.eos_token()), (Some("tok1099"), Some(5000), None));
    assert!(matches!(long.get("tokenizer.ggml.tokens"), Some(GgufValue::Array(a)) if !a.is_loaded()));
}

#[test]
fn fuzz_gguf_mutated_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let strategy = prop_oneof![
        9 => mutated(committed_seeds()),
        1 => noise(b"GGUF\x03\0\0\0"),
    ];
    fuzz("gguf-mutated", 3000, strategy, |bytes| check(&bytes, dir.path()));
}

#[test]
fn fuzz_gguf_structured() {
    let dir = tempfile::tempdir().unwrap();
    fuzz("gguf-structured", 2500, structured(), |bytes| check(&bytes, dir.path()));
}
