//! Test support: a tiny GGUF writer for synthetic files, and the real model cache.

pub use llmr_hub_mirror::real_model;
use std::path::{Path, PathBuf};

/// A metadata value to write. `Arr` holds its element type id and elements of that type.
#[derive(Clone, Debug)]
pub enum Val {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Arr(u32, Vec<Val>),
    U64(u64),
    I64(i64),
    F64(f64),
    /// A type id and payload written verbatim, to craft invalid values.
    Raw(u32, Vec<u8>),
}

impl Val {
    pub fn type_id(&self) -> u32 {
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
            Val::Raw(id, _) => *id,
        }
    }

    fn payload(&self, out: &mut Vec<u8>) {
        match self {
            Val::U8(v) => out.push(*v),
            Val::I8(v) => out.extend(v.to_le_bytes()),
            Val::U16(v) => out.extend(v.to_le_bytes()),
            Val::I16(v) => out.extend(v.to_le_bytes()),
            Val::U32(v) => out.extend(v.to_le_bytes()),
            Val::I32(v) => out.extend(v.to_le_bytes()),
            Val::F32(v) => out.extend(v.to_le_bytes()),
            Val::Bool(v) => out.push(u8::from(*v)),
            Val::Str(s) => put_str(out, s),
            Val::Arr(elem, items) => {
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    item.payload(out);
                }
            }
            Val::U64(v) => out.extend(v.to_le_bytes()),
            Val::I64(v) => out.extend(v.to_le_bytes()),
            Val::F64(v) => out.extend(v.to_le_bytes()),
            Val::Raw(_, bytes) => out.extend(bytes),
        }
    }
}

pub fn s(text: &str) -> Val {
    Val::Str(text.to_string())
}

pub fn strings<I: IntoIterator<Item = String>>(items: I) -> Val {
    Val::Arr(8, items.into_iter().map(Val::Str).collect())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

struct Tensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
    bytes: u64,
}

/// Writes GGUF v3 (or another version) files: header, metadata, tensor infos, aligned data.
pub struct GgufWriter {
    pub version: u32,
    kvs: Vec<(String, Val)>,
    tensors: Vec<Tensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self { version: 3, kvs: vec![], tensors: vec![] }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn kv(mut self, key: &str, value: Val) -> Self {
        self.kvs.push((key.to_string(), value));
        self
    }

    /// A tensor of F32 (type 0, 4 bytes per element) or Q4_0 (type 2, 18 bytes per 32).
    pub fn tensor(mut self, name: &str, dims: &[u64], ggml_type: u32) -> Self {
        let elements: u64 = dims.iter().product();
        let bytes = match ggml_type {
            0 => elements * 4,
            2 => elements / 32 * 18,
            other => panic!("the test writer knows no ggml type {other}"),
        };
        self.tensors.push(Tensor { name: name.to_string(), dims: dims.to_vec(), ggml_type, bytes });
        self
    }

    pub fn build(&self) -> Vec<u8> {
        const ALIGN: u64 = 32;
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (key, value) in &self.kvs {
            put_str(&mut out, key);
            out.extend(value.type_id().to_le_bytes());
            value.payload(&mut out);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += t.bytes.div_ceil(ALIGN) * ALIGN;
        }
        out.resize((out.len() as u64).div_ceil(ALIGN) as usize * ALIGN as usize, 0);
        // Padding after the last tensor is left out, so that every byte of the file is needed.
        for (i, t) in self.tensors.iter().enumerate() {
            let len = if i + 1 == self.tensors.len() { t.bytes } else { t.bytes.div_ceil(ALIGN) * ALIGN };
            out.extend(std::iter::repeat_n(0x5a, len as usize));
        }
        out
    }

    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.build()).unwrap();
        path.to_path_buf()
    }
}

/// A small llama-like model: metadata of every kind the store reads, a vocabulary of `vocab`
/// tokens named `tok{i}`, and two tensors.
pub fn small_model(arch: &str, file_type: u32, vocab: usize) -> GgufWriter {
    GgufWriter::new()
        .kv("general.architecture", s(arch))
        .kv("general.name", s("Tiny Test"))
        .kv("general.file_type", Val::U32(file_type))
        .kv(&format!("{arch}.context_length"), Val::U32(4096))
        .kv(&format!("{arch}.embedding_length"), Val::U32(64))
        .kv(&format!("{arch}.block_count"), Val::U32(2))
        .kv("tokenizer.ggml.tokens", strings((0..vocab).map(|i| format!("tok{i}"))))
        .kv("tokenizer.ggml.bos_token_id", Val::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Val::U32((vocab - 1) as u32))
        .kv("tokenizer.chat_template", s("{% for m in messages %}{{ m.content }}{% endfor %}"))
        .tensor("token_embd.weight", &[64, 4], 0)
        .tensor("blk.0.ffn_up.weight", &[64, 2], 2)
}

pub fn smollm2() -> PathBuf {
    real_model("smollm2", "smollm2-135m-instruct-q4_1.gguf")
}

pub fn minilm() -> PathBuf {
    real_model("minilm", "all-minilm-l6-v2-f16.gguf")
}

pub fn gemma3() -> PathBuf {
    real_model("gemma3", "gemma-3-270m-q4_k_m.gguf")
}

pub fn tiny_llama() -> PathBuf {
    real_model("tiny", "tiny-random-llama.gguf")
}

pub fn qwen() -> PathBuf {
    real_model("qwen2.5", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
}

/// Links `target` into `dir` under `name` (the store follows symbolic links, so tests need no
/// copies of the real models).
pub fn link(target: &Path, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    llmr_hub_mirror::link(target, &path);
    path
}

/// Names of every entry (hidden ones included) in `dir`, sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}
