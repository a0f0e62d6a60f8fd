//! GGUF metadata values: the thirteen value types, and how to read or skip them.

use super::error::{GgufError, Item};
use super::stream::Stream;
use std::io::{Read, Seek};

/// Longest metadata key (the GGUF specification's bound).
const MAX_KEY_LEN: u64 = 65_535;
/// Longest string value. Chat templates, the largest strings in practice, are tens of KiB.
const MAX_STRING_LEN: u64 = 16 << 20;
/// Arrays up to this many elements are read into memory; longer ones are skipped and kept as
/// (offset, length). The long ones are vocabularies (`tokenizer.ggml.tokens`, `.scores`,
/// `.token_type`, `.merges`: 30k-250k entries, megabytes of small allocations) that only the
/// engine needs; the store only needs two of their elements, read on demand. Per-layer arrays
/// (head counts, sliding-window patterns) stay well below this bound.
pub const INLINE_ARRAY_MAX: u64 = 1024;
/// Arrays of arrays are legal; the bound keeps a crafted file from exhausting the stack.
const MAX_NESTING: u32 = 8;

/// The value type tags of the GGUF format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufType {
    pub fn from_id(id: u32) -> Option<Self> {
        use GgufType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use GgufType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Size of a fixed-size value; `None` for strings and arrays.
    fn fixed_size(self) -> Option<u64> {
        use GgufType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value can take: bounds element counts by the bytes left.
    fn min_size(self) -> u64 {
        match self {
            Self::String => 8,
            Self::Array => 12,
            other => other.fixed_size().unwrap_or(1),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(GgufArray),
}

impl GgufValue {
    pub fn value_type(&self) -> GgufType {
        match self {
            Self::U8(_) => GgufType::U8,
            Self::I8(_) => GgufType::I8,
            Self::U16(_) => GgufType::U16,
            Self::I16(_) => GgufType::I16,
            Self::U32(_) => GgufType::U32,
            Self::I32(_) => GgufType::I32,
            Self::U64(_) => GgufType::U64,
            Self::I64(_) => GgufType::I64,
            Self::F32(_) => GgufType::F32,
            Self::F64(_) => GgufType::F64,
            Self::Bool(_) => GgufType::Bool,
            Self::String(_) => GgufType::String,
            Self::Array(_) => GgufType::Array,
        }
    }

    /// Any integer type holding a non-negative value: writers differ on u32 vs u64 for counts.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// An array value. Short arrays are loaded; long ones (see [`INLINE_ARRAY_MAX`]), and any past a
/// per-file budget of loaded elements, are only located, and their elements read on demand with
/// [`GgufArray::read_element`].
#[derive(Clone, Debug, PartialEq)]
pub struct GgufArray {
    pub elem_type: GgufType,
    pub len: u64,
    /// Byte offset of the first element in the file.
    pub offset: u64,
    values: Option<Vec<GgufValue>>,
}

impl GgufArray {
    /// The elements, when the array was short enough to be loaded.
    pub fn values(&self) -> Option<&[GgufValue]> {
        self.values.as_deref()
    }

    pub fn is_loaded(&self) -> bool {
        self.values.is_some()
    }

    /// Element `index`, from memory when loaded, else read from `reader` (the same file the
    /// header was read from). `Ok(None)` when `index` is out of range.
    pub fn read_element<R: Read + Seek>(&self, reader: R, index: u64) -> Result<Option<GgufValue>, GgufError> {
        if let Some(values) = &self.values {
            return Ok(usize::try_from(index).ok().and_then(|i| values.get(i)).cloned());
        }
        self.element_from(&mut Stream::new(reader)?, index, &Item::Element { index })
    }

    pub(crate) fn element_from<R: Read + Seek>(
        &self,
        stream: &mut Stream<R>,
        index: u64,
        item: &Item,
    ) -> Result<Option<GgufValue>, GgufError> {
        if index >= self.len {
            return Ok(None);
        }
        if let Some(values) = &self.values {
            return Ok(usize::try_from(index).ok().and_then(|i| values.get(i)).cloned());
        }
        match self.elem_type.fixed_size() {
            Some(size) => stream.seek_to(self.offset + index * size)?,
            None => {
                // Variable-size elements: walk the lengths up to `index`.
                stream.seek_to(self.offset)?;
                for _ in 0..index {
                    skip_value(stream, self.elem_type, item, 1)?;
                }
            }
        }
        read_value(stream, self.elem_type, item, 1).map(Some)
    }
}

pub(crate) fn read_type<R: Read + Seek>(stream: &mut Stream<R>, item: &Item) -> Result<GgufType, GgufError> {
    let offset = stream.pos();
    let type_id = stream.u32(item)?;
    GgufType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType { item: item.clone(), offset, type_id })
}

pub(crate) fn read_key<R: Read + Seek>(stream: &mut Stream<R>, item: &Item) -> Result<String, GgufError> {
    read_string(stream, item, MAX_KEY_LEN)
}

fn read_len<R: Read + Seek>(stream: &mut Stream<R>, item: &Item, limit: u64) -> Result<u64, GgufError> {
    let offset = stream.pos();
    let len = stream.u64(item)?;
    let limit = limit.min(stream.remaining());
    if len > limit {
        return Err(GgufError::TooLarge { item: item.clone(), offset, value: len, limit });
    }
    Ok(len)
}

fn read_string<R: Read + Seek>(stream: &mut Stream<R>, item: &Item, limit: u64) -> Result<String, GgufError> {
    let len = read_len(stream, item, limit)?;
    let offset = stream.pos();
    let bytes = stream.bytes(len, item)?;
    String::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { item: item.clone(), offset })
}

/// Reads the array header: element type and a count that fits in the bytes left.
fn read_array_header<R: Read + Seek>(
    stream: &mut Stream<R>,
    item: &Item,
    depth: u32,
) -> Result<(GgufType, u64), GgufError> {
    if depth > MAX_NESTING {
        return Err(GgufError::TooDeep { item: item.clone(), offset: stream.pos(), limit: MAX_NESTING });
    }
    let elem_type = read_type(stream, item)?;
    // The count itself takes 8 of the bytes left.
    let max_len = stream.remaining().saturating_sub(8) / elem_type.min_size();
    let len = read_len(stream, item, max_len)?;
    Ok((elem_type, len))
}

/// Reads one value of type `ty`; `depth` counts enclosing arrays.
pub(crate) fn read_value<R: Read + Seek>(
    stream: &mut Stream<R>,
    ty: GgufType,
    item: &Item,
    depth: u32,
) -> Result<GgufValue, GgufError> {
    Ok(match ty {
        GgufType::U8 => GgufValue::U8(stream.u8(item)?),
        GgufType::I8 => GgufValue::I8(i8::from_le_bytes(stream.array(item)?)),
        GgufType::U16 => GgufValue::U16(u16::from_le_bytes(stream.array(item)?)),
        GgufType::I16 => GgufValue::I16(i16::from_le_bytes(stream.array(item)?)),
        GgufType::U32 => GgufValue::U32(stream.u32(item)?),
        GgufType::I32 => GgufValue::I32(i32::from_le_bytes(stream.array(item)?)),
        GgufType::U64 => GgufValue::U64(stream.u64(item)?),
        GgufType::I64 => GgufValue::I64(i64::from_le_bytes(stream.array(item)?)),
        GgufType::F32 => GgufValue::F32(f32::from_le_bytes(stream.array(item)?)),
        GgufType::F64 => GgufValue::F64(f64::from_le_bytes(stream.array(item)?)),
        GgufType::Bool => {
            let offset = stream.pos();
            match stream.u8(item)? {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                byte => return Err(GgufError::InvalidBool { item: item.clone(), offset, byte }),
            }
        }
        GgufType::String => GgufValue::String(read_string(stream, item, MAX_STRING_LEN)?),
        GgufType::Array => {
            let (elem_type, len) = read_array_header(stream, item, depth + 1)?;
            let offset = stream.pos();
            let values = if len <= INLINE_ARRAY_MAX && len <= stream.inline_budget {
                stream.inline_budget -= len;
                let mut values = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    values.push(read_value(stream, elem_type, item, depth + 1)?);
                }
                Some(values)
            } else {
                skip_elements(stream, elem_type, len, item, depth + 1)?;
                None
            };
            GgufValue::Array(GgufArray { elem_type, len, offset, values })
        }
    })
}

/// Moves past one value of type `ty` without keeping it, checking it as thoroughly as reading.
fn skip_value<R: Read + Seek>(stream: &mut Stream<R>, ty: GgufType, item: &Item, depth: u32) -> Result<(), GgufError> {
    match ty {
        GgufType::String => {
            let len = read_len(stream, item, MAX_STRING_LEN)?;
            stream.skip(len, item)
        }
        GgufType::Array => {
            let (elem_type, len) = read_array_header(stream, item, depth + 1)?;
            skip_elements(stream, elem_type, len, item, depth + 1)
        }
        GgufType::Bool => read_value(stream, ty, item, depth).map(drop),
        fixed => stream.skip(fixed.fixed_size().unwrap_or(0), item),
    }
}

fn skip_elements<R: Read + Seek>(
    stream: &mut Stream<R>,
    elem_type: GgufType,
    len: u64,
    item: &Item,
    depth: u32,
) -> Result<(), GgufError> {
    match elem_type.fixed_size() {
        // Bools are checked one by one; other fixed-size runs are skipped at once (the count was
        // bounded by the bytes left, so the product cannot overflow).
        Some(size) if elem_type != GgufType::Bool => stream.skip(len * size, item),
        _ => (0..len).try_for_each(|_| skip_value(stream, elem_type, item, depth)),
    }
}
