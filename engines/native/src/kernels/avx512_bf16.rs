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

/// `src` rounded to bf16 (to nearest even) into `dst` (the same length).
///
/// # Safety
/// The CPU must pass [`available`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn narrow(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len());
    let mut i = 0;
    while i < src.len() {
        let left = (src.len() - i).min(16);
        let mask = if left == 16 { u16::MAX } else { (1u16 << left) - 1 };
        // SAFETY: the masks limit both accesses to the `left` values that remain.
        unsafe {
            let v = _mm512_maskz_loadu_ps(mask, src.as_ptr().add(i));
            let b: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
            _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i) as *mut i16, mask, b);
        }
        i += 16;
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
    }
}
