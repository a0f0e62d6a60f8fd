//! Walks the tensor descriptions that follow the metadata, without reading tensor data, to find
//! where the data section starts and how long the file must be. This is what catches the most
//! common damage, an interrupted download, which leaves the header intact.

use super::error::{GgufError, Item, TensorProblem};
use super::stream::Stream;
use std::io::{Read, Seek};

/// ggml allows at most four dimensions.
const MAX_DIMS: u32 = 4;
/// ggml names are at most 63 bytes; the bound here is looser and only stops absurd lengths.
const MAX_NAME_LEN: u64 = 4096;
/// Smallest tensor description: name length, a 1-byte name, no dims, type, offset.
pub(crate) const MIN_TENSOR_INFO: u64 = 8 + 1 + 4 + 4 + 8;

/// (elements per block, bytes per block) of the ggml tensor types, from ggml's type traits.
fn block_layout(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        16 => (256, 66),  // IQ2_XXS
        17 => (256, 74),  // IQ2_XS
        18 => (256, 98),  // IQ3_XXS
        19 => (256, 50),  // IQ1_S
        20 => (32, 18),   // IQ4_NL
        21 => (256, 110), // IQ3_S
        22 => (256, 82),  // IQ2_S
        23 => (256, 136), // IQ4_XS
        24 => (1, 1),     // I8
        25 => (1, 2),     // I16
        26 => (1, 4),     // I32
        27 => (1, 8),     // I64
        28 => (1, 8),     // F64
        29 => (256, 56),  // IQ1_M
        30 => (1, 2),     // BF16
        34 => (256, 54),  // TQ1_0
        35 => (256, 66),  // TQ2_0
        39 => (32, 17),   // MXFP4
        40 => (64, 36),   // NVFP4
        41 => (128, 18),  // Q1_0
        42 => (64, 18),   // Q2_0
        _ => return None,
    })
}

/// Reads `count` tensor descriptions; returns the data section's offset and the file length the
/// tensors need.
pub(crate) fn walk_tensor_infos<R: Read + Seek>(
    stream: &mut Stream<R>,
    count: u64,
    alignment: u64,
) -> Result<(u64, u64), GgufError> {
    let mut data_len = 0u64;
    for index in 0..count {
        let item = Item::TensorInfo { index };
        let start = stream.pos();
        let name_len = stream.u64(&item)?;
        let limit = MAX_NAME_LEN.min(stream.remaining());
        if name_len > limit {
            return Err(GgufError::TooLarge { item, offset: start, value: name_len, limit });
        }
        stream.skip(name_len, &item)?;
        let dims_at = stream.pos();
        let n_dims = stream.u32(&item)?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::BadDimensions { item, offset: dims_at, n_dims });
        }
        let mut elements = 1u64;
        let mut first_dim = 1u64;
        for d in 0..n_dims {
            let dim = stream.u64(&item)?;
            if d == 0 {
                first_dim = dim;
            }
            elements = elements.checked_mul(dim).ok_or(GgufError::BadTensor {
                item: item.clone(),
                offset: dims_at,
                problem: TensorProblem::Overflow,
            })?;
        }
        let ggml_type = stream.u32(&item)?;
        let offset_at = stream.pos();
        let data_offset = stream.u64(&item)?;
        let bad = |problem| GgufError::BadTensor { item: item.clone(), offset: offset_at, problem };
        if data_offset % alignment != 0 {
            return Err(bad(TensorProblem::Misaligned { data_offset, alignment }));
        }
        // An unknown (newer) type cannot be sized here; the engine will judge it.
        let Some((block, block_bytes)) = block_layout(ggml_type) else {
            tracing::debug!(index, ggml_type, "unknown ggml tensor type; its size is not checked");
            data_len = data_len.max(data_offset);
            continue;
        };
        if !first_dim.is_multiple_of(block) {
            return Err(bad(TensorProblem::PartialBlock { first_dim, block }));
        }
        let end = (elements / block)
            .checked_mul(block_bytes)
            .and_then(|bytes| bytes.checked_add(data_offset))
            .ok_or_else(|| bad(TensorProblem::Overflow))?;
        data_len = data_len.max(end);
    }
    let data_start = stream.pos().div_ceil(alignment) * alignment;
    let needed = data_start.saturating_add(data_len);
    Ok((data_start, needed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_blocks_are_sized_per_block() {
        // Q4_K_M's main type: 256 weights in 144 bytes (4.5 bits per weight).
        assert_eq!(block_layout(12), Some((256, 144)));
        assert_eq!(block_layout(4), None, "Q4_2 was removed from ggml");
    }
}
