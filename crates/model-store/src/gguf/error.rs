//! Why a GGUF header could not be read, with the byte offset where the problem was found.

use std::fmt;

/// The part of the file being read when an error was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Magic,
    Version,
    TensorCount,
    MetadataCount,
    /// The key of the `index`-th (0-based) metadata pair.
    Key {
        index: u64,
    },
    /// The value stored under `key` (or an element of it, for arrays).
    Value {
        key: String,
    },
    /// The `index`-th (0-based) tensor description.
    TensorInfo {
        index: u64,
    },
    /// Element `index` of an array read on demand.
    Element {
        index: u64,
    },
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Magic => f.write_str("magic"),
            Self::Version => f.write_str("version"),
            Self::TensorCount => f.write_str("tensor count"),
            Self::MetadataCount => f.write_str("metadata count"),
            Self::Key { index } => write!(f, "key of metadata pair #{index}"),
            Self::Value { key } => write!(f, "value of '{key}'"),
            Self::TensorInfo { index } => write!(f, "tensor info #{index}"),
            Self::Element { index } => write!(f, "array element #{index}"),
        }
    }
}

/// How callers should treat an error: the engine maps `NotGguf`/`Unsupported`/`Io` to
/// LOAD_FAILED and `Corrupt` to MODEL_CORRUPT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufErrorKind {
    NotGguf,
    Unsupported,
    Corrupt,
    Io,
}

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file: it starts with {found:?}, expected \"GGUF\"")]
    NotGguf { found: Vec<u8> },
    #[error("unsupported GGUF version {version} at byte 4 (supported: 2, 3)")]
    UnsupportedVersion { version: u32 },
    #[error("big-endian GGUF (version {version} byte-swapped) is not supported")]
    BigEndian { version: u32 },
    #[error("truncated GGUF: {item} at byte {offset} needs {needed} bytes, the file ends at byte {file_len}")]
    Truncated { item: Item, offset: u64, needed: u64, file_len: u64 },
    #[error("corrupt GGUF: {item} at byte {offset}: {value} exceeds the limit of {limit}")]
    TooLarge { item: Item, offset: u64, value: u64, limit: u64 },
    #[error("corrupt GGUF: {item} at byte {offset}: unknown value type {type_id}")]
    UnknownValueType { item: Item, offset: u64, type_id: u32 },
    #[error("corrupt GGUF: {item} at byte {offset}: string is not valid UTF-8")]
    InvalidUtf8 { item: Item, offset: u64 },
    #[error("corrupt GGUF: {item} at byte {offset}: boolean byte is {byte}, expected 0 or 1")]
    InvalidBool { item: Item, offset: u64, byte: u8 },
    #[error("corrupt GGUF: {item} at byte {offset}: arrays nested deeper than {limit} levels")]
    TooDeep { item: Item, offset: u64, limit: u32 },
    #[error("corrupt GGUF: duplicate metadata key '{key}' at byte {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("corrupt GGUF: general.alignment must be an integer power of two, got {found:?}")]
    BadAlignment { found: super::GgufValue },
    #[error("corrupt GGUF: {item} at byte {offset}: {n_dims} dimensions (at most 4)")]
    BadDimensions { item: Item, offset: u64, n_dims: u32 },
    #[error("corrupt GGUF: {item} at byte {offset}: {problem}")]
    BadTensor { item: Item, offset: u64, problem: TensorProblem },
    #[error("truncated GGUF: the tensor data needs the file to be {expected_len} bytes, it is {file_len}")]
    DataTruncated { expected_len: u64, file_len: u64 },
    #[error("I/O error reading GGUF at byte {offset}: {source}")]
    Io {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
}

/// What is wrong with one tensor description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorProblem {
    /// Its element count overflows 64 bits.
    Overflow,
    /// Its data offset is not a multiple of the file's alignment.
    Misaligned { data_offset: u64, alignment: u64 },
    /// Its first dimension does not fill whole quantization blocks.
    PartialBlock { first_dim: u64, block: u64 },
}

impl fmt::Display for TensorProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overflow => f.write_str("its size overflows 64 bits"),
            Self::Misaligned { data_offset, alignment } => {
                write!(f, "data offset {data_offset} is not a multiple of the alignment {alignment}")
            }
            Self::PartialBlock { first_dim, block } => {
                write!(f, "first dimension {first_dim} is not a multiple of the block size {block}")
            }
        }
    }
}

impl GgufError {
    pub fn kind(&self) -> GgufErrorKind {
        match self {
            Self::NotGguf { .. } => GgufErrorKind::NotGguf,
            Self::UnsupportedVersion { .. } | Self::BigEndian { .. } => GgufErrorKind::Unsupported,
            Self::Io { .. } => GgufErrorKind::Io,
            Self::Truncated { .. }
            | Self::TooLarge { .. }
            | Self::UnknownValueType { .. }
            | Self::InvalidUtf8 { .. }
            | Self::InvalidBool { .. }
            | Self::TooDeep { .. }
            | Self::DuplicateKey { .. }
            | Self::BadAlignment { .. }
            | Self::BadDimensions { .. }
            | Self::BadTensor { .. }
            | Self::DataTruncated { .. } => GgufErrorKind::Corrupt,
        }
    }

    /// True when the file is a GGUF whose content is damaged (MODEL_CORRUPT).
    pub fn is_corrupt(&self) -> bool {
        self.kind() == GgufErrorKind::Corrupt
    }
}
