//! AVX2 kernels of attention over int8 blocks of the KV cache, in integer arithmetic.
//!
//! The f32 kernels (`attention_avx2.rs`) widen every code to f32 and pay one FMA per code and
//! query head, the same as an f16 value: int8 read half the bytes of f16 at no less arithmetic,
//! and on a CPU that is bound by arithmetic it ran at 0.7-0.9x the f16 cache. Here the other
//! side of each product is made integer instead: a query head's keys multipliers (the query
//! times each channel's scale) and a head's weights over a block's rows (softmax weight times
//! each row's scale) are rounded to i16 with one step per head and block, and `vpmaddwd`
//! multiplies sixteen codes by them and adds the pairs, half the instructions of FMAs over f32
//! for the same codes. The sums are exact integers, so every query that reads a block gets
//! the same bits whatever its tile. The multipliers keep 15 bits (a relative step of 3e-5,
//! far below the codes' own 8 bits).
//!
//! Int8 blocks are laid out for it (`kv_levels.rs`): keys as channel pairs over the block's
//! rows (`[hd / 2][BLOCK_TOKENS][2]`), values as row pairs over the channels
//! (`[BLOCK_TOKENS / 2][hd][2]`). A pair multiply-add then sums along the dot product's own
//! axis, and each of a register's eight lanes ends with one row's score (keys) or one
//! channel's sum (values): no horizontal sums.

use crate::kv_cache::BLOCK_TOKENS;
use half::f16;
use std::arch::x86_64::*;

/// The largest i16 multiplier. Codes are within +-127, so a head of up to `MAX_HEAD_DIM`
/// channels sums to at most 512 * 127 * 32767 < 2^31: an i32 lane cannot overflow.
const MULTIPLIER_MAX: f32 = 32767.0;
const MAX_HEAD_DIM: usize = 512;

/// For each of `heads` query heads `h` (rows of `hd` in `q`) and each row `s` in `a..b` of a
/// block of int8 keys (`codes`, channel pairs; a key is `code * channel_scale[c]`):
/// `out[h * stride + s - a] = scale * q[h] . key s`. `fold` holds the heads' multipliers.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn int8_dots(
    codes: &[i8],
    channel_scale: &[f16],
    (a, b): (usize, usize),
    hd: usize,
    q: &[f32],
    heads: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
    fold: &mut Vec<f32>,
) {
    assert!(hd.is_multiple_of(8) && hd <= MAX_HEAD_DIM && a <= b && b <= BLOCK_TOKENS);
    assert!(codes.len() >= BLOCK_TOKENS * hd && channel_scale.len() >= hd && q.len() >= heads * hd);
    assert!(heads == 0 || out.len() >= (heads - 1) * stride + (b - a));
    if a == b {
        return;
    }
    // fold: each head's multipliers (a pair of i16 in each f32's bits), then its step times
    // `scale`.
    let pairs = hd / 2;
    fold.resize(heads * (pairs + 1), 0.0);
    let (multipliers, steps) = fold.split_at_mut(heads * pairs);
    for (h, step) in steps.iter_mut().enumerate() {
        // SAFETY: the CPU has AVX2, FMA and F16C; lengths asserted above.
        *step =
            unsafe { quantize_pairs(&q[h * hd..][..hd], &channel_scale[..hd], &mut multipliers[h * pairs..][..pairs]) }
                * scale;
    }
    let mut h = 0;
    while h < heads {
        let (m, st, o) = (&multipliers[h * pairs..], &steps[h..], &mut out[h * stride..]);
        // SAFETY (each call): codes hold the block, m and st the next heads' multipliers and
        // steps, and o their rows a..b (asserted above).
        h += unsafe {
            match heads - h {
                1 => key_dots::<1>(codes, (a, b), pairs, m, st, o, stride),
                2 => key_dots::<2>(codes, (a, b), pairs, m, st, o, stride),
                3 => key_dots::<3>(codes, (a, b), pairs, m, st, o, stride),
                _ => key_dots::<4>(codes, (a, b), pairs, m, st, o, stride),
            }
        };
    }
}

/// [`int8_dots`] for `H` heads; returns `H`. Rows in two halves of eight, one lane a row.
#[inline(always)]
unsafe fn key_dots<const H: usize>(
    codes: &[i8],
    (a, b): (usize, usize),
    pairs: usize,
    multipliers: &[f32],
    steps: &[f32],
    out: &mut [f32],
    stride: usize,
) -> usize {
    let (cp, mp) = (codes.as_ptr(), multipliers.as_ptr());
    let half = BLOCK_TOKENS / 2;
    // SAFETY (every access): pair p's 16 bytes of rows t0..t0+8 lie at (p * BLOCK_TOKENS + t0)
    // * 2 inside the block; head h's multipliers at h * pairs + p inside `multipliers`.
    unsafe {
        let (lo, hi) = (a < half, b > half);
        let mut acc = [[_mm256_setzero_si256(); 2]; H];
        for p in 0..pairs {
            let at = |t0: usize| _mm256_cvtepi8_epi16(_mm_loadu_si128(cp.add((p * BLOCK_TOKENS + t0) * 2).cast()));
            let x =
                [if lo { at(0) } else { _mm256_setzero_si256() }, if hi { at(half) } else { _mm256_setzero_si256() }];
            for (h, acc) in acc.iter_mut().enumerate() {
                let m = _mm256_castps_si256(_mm256_broadcast_ss(&*mp.add(h * pairs + p)));
                acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(x[0], m));
                acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(x[1], m));
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let mut rows = [0f32; BLOCK_TOKENS];
            let step = _mm256_set1_ps(steps[h]);
            _mm256_storeu_ps(rows.as_mut_ptr(), _mm256_mul_ps(_mm256_cvtepi32_ps(acc[0]), step));
            _mm256_storeu_ps(rows.as_mut_ptr().add(half), _mm256_mul_ps(_mm256_cvtepi32_ps(acc[1]), step));
            out[h * stride..][..b - a].copy_from_slice(&rows[a..b]);
        }
    }
    H
}

/// For each of `heads` query heads `h`: `out[h] += sum over rows s in a..b of
/// weights[h * stride + s - a] * value s`, over a block of int8 values (`codes`, row pairs; a
/// value is `code * row_scale[s]`; `out` rows of `hd`). `fold` holds the heads' multipliers.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn int8_weighted_sum(
    codes: &[i8],
    row_scale: &[f16],
    (a, b): (usize, usize),
    hd: usize,
    weights: &[f32],
    stride: usize,
    heads: usize,
    out: &mut [f32],
    fold: &mut Vec<f32>,
) {
    assert!(hd.is_multiple_of(8) && hd <= MAX_HEAD_DIM && a <= b && b <= BLOCK_TOKENS);
    assert!(codes.len() >= BLOCK_TOKENS * hd && row_scale.len() >= BLOCK_TOKENS && out.len() >= heads * hd);
    assert!(heads == 0 || weights.len() >= (heads - 1) * stride + (b - a));
    if a == b {
        return;
    }
    // fold: each head's multipliers for the block's row pairs, then its step.
    let pairs = BLOCK_TOKENS / 2;
    fold.resize(heads * (pairs + 1), 0.0);
    let (multipliers, steps) = fold.split_at_mut(heads * pairs);
    for (h, step) in steps.iter_mut().enumerate() {
        // Rows outside a..b weigh nothing: their codes are multiplied by 0.
        let mut w = [0f32; BLOCK_TOKENS];
        w[a..b].copy_from_slice(&weights[h * stride..][..b - a]);
        // SAFETY: the CPU has AVX2, FMA and F16C; lengths asserted above.
        *step = unsafe { quantize_pairs(&w, &row_scale[..BLOCK_TOKENS], &mut multipliers[h * pairs..][..pairs]) };
    }
    let mut h = 0;
    while h < heads {
        let (m, st, o) = (&multipliers[h * pairs..], &steps[h..], &mut out[h * hd..]);
        // SAFETY (each call): as in `int8_dots`; o holds the next heads' rows of hd.
        h += unsafe {
            match heads - h {
                1 => value_sums::<1>(codes, (a, b), hd, m, st, o),
                2 => value_sums::<2>(codes, (a, b), hd, m, st, o),
                3 => value_sums::<3>(codes, (a, b), hd, m, st, o),
                _ => value_sums::<4>(codes, (a, b), hd, m, st, o),
            }
        };
    }
}

/// [`int8_weighted_sum`] for `H` heads; returns `H`. Sixteen channels at a time (eight at the
/// end of a head_dim that is not a multiple of 16), one lane a channel, over the row pairs that
/// hold rows of a..b.
#[inline(always)]
unsafe fn value_sums<const H: usize>(
    codes: &[i8],
    (a, b): (usize, usize),
    hd: usize,
    multipliers: &[f32],
    steps: &[f32],
    out: &mut [f32],
) -> usize {
    let pairs = BLOCK_TOKENS / 2;
    let (cp, mp, op) = (codes.as_ptr(), multipliers.as_ptr(), out.as_mut_ptr());
    // SAFETY (every access): row pair j's channels c..c+16 (or c+8) are the bytes from
    // (j * hd + c) * 2 inside the block; head h's multipliers at h * pairs + j, its outputs at
    // h * hd + c..+16 (or +8).
    unsafe {
        let mut c = 0;
        while c < hd {
            let wide = c + 16 <= hd;
            let mut acc = [[_mm256_setzero_si256(); 2]; H];
            for j in a / 2..b.div_ceil(2) {
                let at = |c: usize| _mm256_cvtepi8_epi16(_mm_loadu_si128(cp.add((j * hd + c) * 2).cast()));
                let x = [at(c), if wide { at(c + 8) } else { _mm256_setzero_si256() }];
                for (h, acc) in acc.iter_mut().enumerate() {
                    let m = _mm256_castps_si256(_mm256_broadcast_ss(&*mp.add(h * pairs + j)));
                    acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(x[0], m));
                    acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(x[1], m));
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                let step = _mm256_set1_ps(steps[h]);
                for (i, acc) in acc.iter().enumerate().take(if wide { 2 } else { 1 }) {
                    let o = op.add(h * hd + c + i * 8);
                    _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(*acc), step, _mm256_loadu_ps(o)));
                }
            }
            c += if wide { 16 } else { 8 };
        }
    }
    H
}

/// `x * scale` (lanes of f32 times f16 scales, `x.len()` a multiple of 8) rounded to i16
/// multipliers with one step, stored as pairs (the even index in the low half) in the bits of
/// `out`'s f32s; returns the step (0 when every product is 0).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn quantize_pairs(x: &[f32], scale: &[f16], out: &mut [f32]) -> f32 {
    let n = x.len();
    assert!(n.is_multiple_of(8) && scale.len() == n && out.len() == n / 2);
    let (xp, sp, op) = (x.as_ptr(), scale.as_ptr(), out.as_mut_ptr());
    // SAFETY (every access): c + 8 <= n inside x and scale; c / 2 + 4 (or + 8) <= n / 2 inside
    // out.
    unsafe {
        let product =
            |c: usize| _mm256_mul_ps(_mm256_loadu_ps(xp.add(c)), _mm256_cvtph_ps(_mm_loadu_si128(sp.add(c).cast())));
        let mut largest = _mm256_setzero_ps();
        for c in (0..n).step_by(8) {
            largest = _mm256_max_ps(largest, _mm256_andnot_ps(_mm256_set1_ps(-0.0), product(c)));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), largest);
        let largest = lanes.iter().copied().fold(0f32, f32::max);
        if !(largest > 0.0 && largest.is_finite()) {
            out.fill(0.0);
            return 0.0;
        }
        let inv = _mm256_set1_ps(MULTIPLIER_MAX / largest);
        let rounded = |c: usize| _mm256_cvtps_epi32(_mm256_mul_ps(product(c), inv));
        let mut c = 0;
        while c + 16 <= n {
            // packs works within 128-bit lanes: [c..c+4, c+8..c+12 | c+4..c+8, c+12..c+16];
            // the permute puts the channels back in order.
            let packed = _mm256_packs_epi32(rounded(c), rounded(c + 8));
            _mm256_storeu_si256(op.add(c / 2).cast(), _mm256_permute4x64_epi64::<0b11_01_10_00>(packed));
            c += 16;
        }
        if c < n {
            let r = rounded(c);
            _mm_storeu_si128(
                op.add(c / 2).cast(),
                _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256::<1>(r)),
            );
        }
        largest / MULTIPLIER_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_levels::{key8_at, value8_at};

    /// A block of int8 keys and values with their scales, and queries.
    struct Case {
        keys: Vec<i8>,
        values: Vec<i8>,
        channel: Vec<f16>,
        row: Vec<f16>,
        q: Vec<f32>,
    }

    /// Codes, their scales and queries, with outliers in a channel and a row as real caches
    /// have.
    fn case(hd: usize, heads: usize) -> Case {
        let code = |i: usize| ((i * 7919 % 255) as i32 - 127) as i8;
        let keys: Vec<i8> = (0..BLOCK_TOKENS * hd).map(code).collect();
        let values: Vec<i8> = (0..BLOCK_TOKENS * hd).map(|i| code(i * 31 + 5)).collect();
        let channel: Vec<f16> =
            (0..hd).map(|c| f16::from_f32(if c == 3 { 0.2 } else { 0.01 + c as f32 * 1e-4 })).collect();
        let row: Vec<f16> = (0..BLOCK_TOKENS).map(|t| f16::from_f32(if t == 6 { 0.05 } else { 0.008 })).collect();
        let q: Vec<f32> = (0..heads * hd).map(|i| ((i * 13) as f32 * 0.37).sin() * 2.0).collect();
        Case { keys, values, channel, row, q }
    }

    #[test]
    fn integer_dots_and_weighted_sums_match_f64_over_the_dequantized_block() {
        if !crate::kernels::simd() {
            return;
        }
        for hd in [64, 72] {
            for heads in 1..=5 {
                let Case { keys, values, channel, row, q } = case(hd, heads);
                for (a, b) in [(0, 16), (3, 16), (0, 5), (9, 16), (5, 11), (7, 8), (4, 4)] {
                    let stride = 20;
                    let mut scores = vec![f32::NAN; heads * stride];
                    let mut fold = Vec::new();
                    // SAFETY: simd() found AVX2, FMA and F16C.
                    unsafe { int8_dots(&keys, &channel, (a, b), hd, &q, heads, 0.125, &mut scores, stride, &mut fold) };
                    let weights: Vec<f32> =
                        (0..heads * stride).map(|i| ((i * 5) as f32 * 0.3).cos().abs() / 8.0).collect();
                    let mut out: Vec<f32> = (0..heads * hd).map(|i| i as f32 * 0.001).collect();
                    let before = out.clone();
                    // SAFETY: as above.
                    unsafe {
                        int8_weighted_sum(&values, &row, (a, b), hd, &weights, stride, heads, &mut out, &mut fold)
                    };
                    for h in 0..heads {
                        for s in a..b {
                            let want: f64 = (0..hd)
                                .map(|c| q[h * hd + c] as f64 * keys[key8_at(s, c)] as f64 * channel[c].to_f64())
                                .sum::<f64>()
                                * 0.125;
                            let got = scores[h * stride + s - a] as f64;
                            // Each multiplier is within half a step (1/32767 of the largest) of
                            // query times scale, each code within +-127; and f32's own rounding.
                            let largest = (0..hd)
                                .map(|c| (q[h * hd + c] as f64 * channel[c].to_f64()).abs())
                                .fold(0f64, f64::max);
                            let codes: f64 = (0..hd).map(|c| (keys[key8_at(s, c)] as f64).abs()).sum();
                            let bound = 0.125 * 0.5 * largest / 32767.0 * codes + 1e-6 * want.abs();
                            assert!(
                                (got - want).abs() <= bound,
                                "hd {hd} heads {heads} ({a},{b}) h {h} s {s}: {got} vs {want}"
                            );
                        }
                        assert!(
                            scores[h * stride + (b - a)..][..stride - (b - a)].iter().all(|x| x.is_nan()),
                            "rows past b untouched"
                        );
                        for c in 0..hd {
                            let sum: f64 = (a..b)
                                .map(|s| {
                                    weights[h * stride + s - a] as f64
                                        * values[value8_at(s, c, hd)] as f64
                                        * row[s].to_f64()
                                })
                                .sum();
                            let want = before[h * hd + c] as f64 + sum;
                            let scale: f64 =
                                (a..b).map(|s| weights[h * stride + s - a] as f64 * row[s].to_f64() * 127.0).sum();
                            let got = out[h * hd + c] as f64;
                            assert!(
                                (got - want).abs() <= 2e-4 * scale + 1e-6,
                                "values hd {hd} heads {heads} ({a},{b}) h {h} c {c}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_zero_query_or_zero_weights_give_zero_and_no_nan() {
        if !crate::kernels::simd() {
            return;
        }
        let hd = 64;
        let Case { keys, values, channel, row, .. } = case(hd, 1);
        let (mut scores, mut out, mut fold) = (vec![1f32; BLOCK_TOKENS], vec![0.5f32; hd], Vec::new());
        // SAFETY: simd() found AVX2, FMA and F16C.
        unsafe {
            int8_dots(&keys, &channel, (0, 16), hd, &[0.0; 64], 1, 1.0, &mut scores, 16, &mut fold);
            int8_weighted_sum(&values, &row, (0, 16), hd, &[0.0; 16], 16, 1, &mut out, &mut fold);
        }
        assert!(scores.iter().all(|&x| x == 0.0) && out.iter().all(|&x| x == 0.5));
    }
}
