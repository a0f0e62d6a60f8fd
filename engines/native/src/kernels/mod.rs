//! CPU kernels of the forward pass over weights as stored on disk (f32 sums; bf16 products for
//! bf16 weights where the CPU has AVX-512 BF16).

/// Evaluates `$call` with `$n` the const 1 to 4 that `$left` asks for (4 for more): the
/// attention kernels take up to four query heads at a time, each head's sums in registers.
#[cfg(target_arch = "x86_64")]
macro_rules! up_to_four {
    ($left:expr, $n:ident, $call:expr) => {
        match $left {
            1 => {
                const $n: usize = 1;
                $call
            }
            2 => {
                const $n: usize = 2;
                $call
            }
            3 => {
                const $n: usize = 3;
                $call
            }
            _ => {
                const $n: usize = 4;
                $call
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx_bf16;
#[cfg(target_arch = "x86_64")]
pub(crate) mod attention_avx2;
#[cfg(target_arch = "x86_64")]
mod attention_int4;
#[cfg(target_arch = "x86_64")]
pub(crate) mod attention_integer;
#[cfg(target_arch = "x86_64")]
pub(crate) mod attention_tiles;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_bf16;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16_tiles;
pub mod linear;
pub mod mxfp4;
pub mod ops;
pub(crate) mod panel;

/// What takes a prompt step's bf16 products in attention (`attention.rs`): AMX tiles, or the
/// same products on AVX-512 BF16 vectors where the CPU has no AMX (`avx512_bf16_tiles.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Unit {
    Tiles,
    Vectors,
}

impl Bf16Unit {
    /// Whether this CPU has the unit (and lets the process use it).
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return match self {
            Bf16Unit::Tiles => amx_bf16::available(),
            Bf16Unit::Vectors => avx512_bf16::available(),
        };
        #[cfg(not(target_arch = "x86_64"))]
        false
    }
}

/// Whether the AVX2 + FMA + F16C kernels can run on this CPU (the answer is cached by the
/// standard library).
pub(crate) fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Asks the CPU to bring the `bytes` from `data` into its cache (one request per 64-byte line;
/// nothing where the target has no prefetch instruction). A prefetch never faults, so the span
/// may reach past an allocation.
#[inline(always)]
pub(crate) fn prefetch(data: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        // From the line that holds `data` to the one that holds its last byte.
        let first = data as usize & !63;
        let last = (data as usize).wrapping_add(bytes.max(1) - 1);
        for line in (first..=last).step_by(64) {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: a prefetch reads nothing architecturally and never faults.
            unsafe { _mm_prefetch(line as *const i8, _MM_HINT_T0) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, bytes);
}

/// `src` as f32 into `dst` (equal lengths). Where the CPU has F16C, eight values a register in
/// one call for the whole slice: the `half` crate's slice conversion makes a call (and checks
/// the CPU) for every eight values, which was 40% of decode time over f16 KV blocks at context
/// 4096.
pub(crate) fn widen_f16(src: &[half::f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: simd() found AVX2, FMA and F16C on this CPU.
        return unsafe { avx2::widen_f16(src, dst) };
    }
    half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
}
