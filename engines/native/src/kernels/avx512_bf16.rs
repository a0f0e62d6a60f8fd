//! AVX-512 BF16 dot products of bf16 weight rows, as stored, with inputs rounded to bf16: one
//! `vdpbf16ps` multiplies 32 pairs and adds them into 16 f32 sums, twice the products of an f32
//! FMA on the same register width, and the weights go in without a widening step. Callers check
//! the CPU ([`available`]) first.

use std::arch::x86_64::*;

/// Values one instruction takes from each operand.
const LANES: usize = 32;

/// Whether the CPU runs these kernels (the standard library caches the answer).
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bf16")
}

/// `src` (f32 or f16, [`Widen16`]) rounded to bf16 (to nearest even) into `dst` (the same
/// length).
///
/// # Safety
/// The CPU must pass [`available`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn narrow<T: Widen16>(src: &[T], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len());
    let mut i = 0;
    while i < src.len() {
        let left = (src.len() - i).min(16);
        let mask = lanes_mask(left);
        // SAFETY: the masks limit both accesses to the `left` values that remain.
        unsafe {
            let b: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(T::widen16(mask, src.as_ptr().add(i))));
            _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i) as *mut i16, mask, b);
        }
        i += 16;
    }
}

/// Each value of `src` as the sum of two bf16 values, `hi` its rounding to bf16 (to nearest
/// even) and `lo` the rest's: 16 bits of precision where one bf16 has 8, and every f16 value
/// exactly. `src` is f32 or f16 ([`Widen16`]); all three have its length.
///
/// # Safety
/// The CPU must pass [`available`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn split<T: Widen16>(src: &[T], hi: &mut [u16], lo: &mut [u16]) {
    assert!(src.len() == hi.len() && src.len() == lo.len());
    let mut i = 0;
    while i < src.len() {
        let left = (src.len() - i).min(16);
        let mask = lanes_mask(left);
        // SAFETY: the masks limit every access to the `left` values that remain.
        unsafe {
            let v = T::widen16(mask, src.as_ptr().add(i));
            let bits = |b: __m256bh| std::mem::transmute::<__m256bh, __m256i>(b);
            let h = bits(_mm512_cvtneps_pbh(v));
            let back = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
            let l = bits(_mm512_cvtneps_pbh(_mm512_sub_ps(v, back)));
            _mm256_mask_storeu_epi16(hi.as_mut_ptr().add(i) as *mut i16, mask, h);
            _mm256_mask_storeu_epi16(lo.as_mut_ptr().add(i) as *mut i16, mask, l);
        }
        i += 16;
    }
}

/// Values [`narrow`] and [`split`] read: up to 16 of them widened to f32.
pub trait Widen16: Copy {
    /// # Safety
    /// The lanes of `mask` are readable at `p`; the CPU has AVX-512F.
    unsafe fn widen16(mask: u16, p: *const Self) -> __m512;
}

impl Widen16 for f32 {
    #[inline(always)]
    unsafe fn widen16(mask: u16, p: *const f32) -> __m512 {
        // SAFETY: the caller's.
        unsafe { _mm512_maskz_loadu_ps(mask, p) }
    }
}

impl Widen16 for half::f16 {
    #[inline(always)]
    unsafe fn widen16(mask: u16, p: *const half::f16) -> __m512 {
        // SAFETY: the caller's; AVX-512F converts f16.
        unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p as *const i16)) }
    }
}

/// The mask of the first `left` (up to 16) lanes of a register of 16.
#[inline(always)]
fn lanes_mask(left: usize) -> u16 {
    if left >= 16 {
        u16::MAX
    } else {
        (1u16 << left) - 1
    }
}

/// The mask of the `left` (< 32) last values of a row.
#[inline(always)]
fn tail_mask(left: usize) -> u32 {
    (1u32 << left) - 1
}

/// Dot products of `G` bf16 inputs `x` with `R` bf16 weight rows at `w` (rows of `k` values,
/// one after the other), as `[input][row]`. Every sum runs the same instructions in the same
/// order whatever `R` and `G` are, so an output does not depend on the inputs or rows it was
/// computed beside. With `prefetch` = `Some(ahead)`, the rows `ahead` rows after these are asked
/// for meanwhile.
///
/// # Safety
/// The CPU must pass [`available`]; every `x[j]` and the `R` rows at `w` hold `k` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn dots<const R: usize, const G: usize>(
    x: [*const u16; G],
    w: *const u16,
    k: usize,
    prefetch: Option<usize>,
) -> [[f32; R]; G] {
    let mut acc = [[_mm512_setzero_ps(); R]; G];
    let main = k / LANES * LANES;
    let mut i = 0;
    while i < main {
        // SAFETY: i + 32 <= k: inside every row and input. A prefetch never faults.
        unsafe {
            let mut wv = [_mm512_setzero_si512(); R];
            for (r, v) in wv.iter_mut().enumerate() {
                if let Some(ahead) = prefetch {
                    _mm_prefetch(w.wrapping_add((ahead + r) * k + i) as *const i8, _MM_HINT_T0);
                }
                *v = _mm512_loadu_si512(w.add(r * k + i) as *const _);
            }
            for (sums, xj) in acc.iter_mut().zip(x) {
                let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(xj.add(i) as *const _));
                for (a, wr) in sums.iter_mut().zip(wv) {
                    *a = _mm512_dpbf16_ps(*a, xv, std::mem::transmute::<__m512i, __m512bh>(wr));
                }
            }
        }
        i += LANES;
    }
    if main < k {
        let mask = tail_mask(k - main);
        // SAFETY: the mask limits every load to the k - main values left in each row and input.
        unsafe {
            for (sums, xj) in acc.iter_mut().zip(x) {
                let xv: __m512bh = std::mem::transmute(_mm512_maskz_loadu_epi16(mask, xj.add(main) as *const i16));
                for (r, a) in sums.iter_mut().enumerate() {
                    let wv: __m512bh =
                        std::mem::transmute(_mm512_maskz_loadu_epi16(mask, w.add(r * k + main) as *const i16));
                    *a = _mm512_dpbf16_ps(*a, xv, wv);
                }
            }
        }
    }
    // Loops, not `map`: a closure would not inherit this function's target features.
    let mut out = [[0f32; R]; G];
    for (o, sums) in out.iter_mut().zip(&acc) {
        for (v, a) in o.iter_mut().zip(sums) {
            *v = _mm512_reduce_add_ps(*a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounding to nearest even, as `half` rounds, over whole registers and a masked tail.
    #[test]
    fn narrowing_rounds_to_nearest_even() {
        if !available() {
            return;
        }
        let src: Vec<f32> = (0..37).map(|i| ((i * 13) as f32 * 0.37).sin() * 10f32.powi(i % 7 - 3)).collect();
        let mut dst = vec![0u16; src.len()];
        // SAFETY: available() checked the CPU.
        unsafe { narrow(&src, &mut dst) };
        let want: Vec<u16> = src.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
        assert_eq!(dst, want);
        // A tie rounds to the even neighbour: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
        let mut one = [0u16];
        // SAFETY: as above.
        unsafe { narrow(&[1.0 + 1.0 / 256.0], &mut one) };
        assert_eq!(one[0], half::bf16::from_f32(1.0).to_bits());
        // From f16, subnormals included, as from their f32 values.
        let bits = (0..37).map(|i| (i * 1777 % 65536) as u16).chain([1, 0x3ff, 0x8001, 0x7bff]);
        let src: Vec<half::f16> = bits.map(half::f16::from_bits).filter(|v| v.is_finite()).collect();
        let mut dst = vec![0u16; src.len()];
        // SAFETY: as above.
        unsafe { narrow(&src, &mut dst) };
        let want: Vec<u16> = src.iter().map(|&v| half::bf16::from_f32(v.to_f32()).to_bits()).collect();
        assert_eq!(dst, want);
    }
}
