//! The GGUF header and metadata, read in one pass, with typed accessors for the keys the node
//! uses.

use super::error::{GgufError, Item};
use super::ftype::quantization_name;
use super::stream::Stream;
use super::tensor::{walk_tensor_infos, MIN_TENSOR_INFO};
use super::value::{read_key, read_type, read_value, GgufValue};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek};
use std::path::Path;

const MAGIC: &[u8; 4] = b"GGUF";
/// Smallest metadata pair: key length, a 1-byte key, type, a 1-byte value.
const MIN_KV: u64 = 8 + 1 + 4 + 1;
const DEFAULT_ALIGNMENT: u64 = 32;
const TOKENS_KEY: &str = "tokenizer.ggml.tokens";

/// How an embedding model pools token states into one vector (`{arch}.pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingType {
    None,
    Mean,
    Cls,
    Last,
    Rank,
    Other(u32),
}

impl PoolingType {
    fn from_u64(v: u64) -> Self {
        match v {
            0 => Self::None,
            1 => Self::Mean,
            2 => Self::Cls,
            3 => Self::Last,
            4 => Self::Rank,
            other => Self::Other(u32::try_from(other).unwrap_or(u32::MAX)),
        }
    }
}

/// A token id and, when the vocabulary has it, its text.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SpecialToken {
    id: u32,
    text: Option<String>,
}

#[derive(Clone, Debug)]
pub struct GgufHeader {
    pub version: u32,
    pub tensor_count: u64,
    pub metadata: BTreeMap<String, GgufValue>,
    /// Where tensor data starts (aligned).
    pub data_offset: u64,
    bos: Option<SpecialToken>,
    eos: Option<SpecialToken>,
}

impl GgufHeader {
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let file = File::open(path).map_err(|source| GgufError::Io { offset: 0, source })?;
        Self::read_from(file)
    }

    /// Reads the header, metadata and tensor descriptions from the start of `reader` (the tensor
    /// data is never read, only checked to fit in the file).
    pub fn read_from<R: Read + Seek>(reader: R) -> Result<Self, GgufError> {
        let mut s = Stream::new(reader)?;
        if s.len() < 4 {
            let found = s.bytes(s.len(), &Item::Magic)?;
            return Err(GgufError::NotGguf { found });
        }
        let magic = s.array::<4>(&Item::Magic)?;
        if &magic != MAGIC {
            return Err(GgufError::NotGguf { found: magic.to_vec() });
        }
        let version = s.u32(&Item::Version)?;
        match version {
            2 | 3 => {}
            v if matches!(v.swap_bytes(), 1..=3) => return Err(GgufError::BigEndian { version: v.swap_bytes() }),
            v => return Err(GgufError::UnsupportedVersion { version: v }),
        }
        let tensor_count = bounded_count(&mut s, Item::TensorCount, MIN_TENSOR_INFO)?;
        let kv_count = bounded_count(&mut s, Item::MetadataCount, MIN_KV)?;

        let mut metadata = BTreeMap::new();
        for index in 0..kv_count {
            let key_at = s.pos();
            let key = read_key(&mut s, &Item::Key { index })?;
            let item = Item::Value { key: key.clone() };
            let ty = read_type(&mut s, &item)?;
            let value = read_value(&mut s, ty, &item, 0)?;
            if metadata.contains_key(&key) {
                return Err(GgufError::DuplicateKey { key, offset: key_at });
            }
            metadata.insert(key, value);
        }

        let alignment = alignment(&metadata)?;
        let (data_offset, needed_len) = walk_tensor_infos(&mut s, tensor_count, alignment)?;
        if needed_len > s.len() {
            return Err(GgufError::DataTruncated { expected_len: needed_len, file_len: s.len() });
        }

        let mut header = Self { version, tensor_count, metadata, data_offset, bos: None, eos: None };
        header.bos = header.special_token(&mut s, "tokenizer.ggml.bos_token_id")?;
        header.eos = header.special_token(&mut s, "tokenizer.ggml.eos_token_id")?;
        Ok(header)
    }

    /// The id stored under `id_key` and its text from the vocabulary, read while the file is
    /// still open so that the accessors need no I/O.
    fn special_token<R: Read + Seek>(
        &self,
        s: &mut Stream<R>,
        id_key: &str,
    ) -> Result<Option<SpecialToken>, GgufError> {
        let Some(id) = self.get(id_key).and_then(GgufValue::as_u64).and_then(|v| u32::try_from(v).ok()) else {
            return Ok(None);
        };
        let Some(tokens) = self.get(TOKENS_KEY).and_then(GgufValue::as_array) else {
            return Ok(Some(SpecialToken { id, text: None }));
        };
        let item = Item::Value { key: TOKENS_KEY.to_string() };
        let text = match tokens.element_from(s, id.into(), &item)? {
            Some(GgufValue::String(text)) => Some(text),
            _ => {
                tracing::warn!(key = id_key, id, vocab = tokens.len, "special token id is not in the vocabulary");
                None
            }
        };
        Ok(Some(SpecialToken { id, text }))
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(GgufValue::as_str)
    }

    /// `{arch}.{suffix}` as an unsigned integer.
    fn arch_u64(&self, suffix: &str) -> Option<u64> {
        let arch = self.architecture()?;
        self.get(&format!("{arch}.{suffix}")).and_then(GgufValue::as_u64)
    }

    /// `general.architecture`, e.g. `llama`, `bert`, `gemma3`.
    pub fn architecture(&self) -> Option<&str> {
        self.str("general.architecture")
    }

    pub fn name(&self) -> Option<&str> {
        self.str("general.name")
    }

    pub fn context_length(&self) -> Option<u64> {
        self.arch_u64("context_length")
    }

    pub fn embedding_length(&self) -> Option<u64> {
        self.arch_u64("embedding_length")
    }

    pub fn block_count(&self) -> Option<u64> {
        self.arch_u64("block_count")
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.str("tokenizer.chat_template")
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos.as_ref().map(|t| t.id)
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos.as_ref().map(|t| t.id)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_ref().and_then(|t| t.text.as_deref())
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos.as_ref().and_then(|t| t.text.as_deref())
    }

    pub fn pooling_type(&self) -> Option<PoolingType> {
        self.arch_u64("pooling_type").map(PoolingType::from_u64)
    }

    /// `{arch}.attention.causal`: false for encoders used as embedding models.
    pub fn causal_attention(&self) -> Option<bool> {
        let arch = self.architecture()?;
        self.get(&format!("{arch}.attention.causal")).and_then(GgufValue::as_bool)
    }

    /// The raw `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn file_type(&self) -> Option<u32> {
        self.get("general.file_type").and_then(GgufValue::as_u64).and_then(|v| u32::try_from(v).ok())
    }

    /// The quantization name derived from `general.file_type`, e.g. `Q4_K_M`.
    pub fn quantization(&self) -> Option<&'static str> {
        self.file_type().and_then(quantization_name)
    }
}

/// Reads a count and refuses one that could not fit in the rest of the file.
fn bounded_count<R: Read + Seek>(s: &mut Stream<R>, item: Item, min_size: u64) -> Result<u64, GgufError> {
    let offset = s.pos();
    let value = s.u64(&item)?;
    let limit = s.remaining() / min_size;
    if value > limit {
        return Err(GgufError::TooLarge { item, offset, value, limit });
    }
    Ok(value)
}

fn alignment(metadata: &BTreeMap<String, GgufValue>) -> Result<u64, GgufError> {
    let Some(value) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value.as_u64() {
        Some(a) if a.is_power_of_two() => Ok(a),
        _ => Err(GgufError::BadAlignment { found: value.clone() }),
    }
}
