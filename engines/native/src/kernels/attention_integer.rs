//! AVX2 kernels of attention over int8 and int4 blocks of the KV cache, in integer arithmetic.
//!
//! Widening every code to f32 and paying one FMA per code and query head costs what an f16
//! value costs: int8 and int4 read fewer bytes at no less arithmetic, and on a CPU that is
//! bound by arithmetic they ran at 0.7-0.9x the f16 cache. Here the other side of each product
//! is made integer instead: a query head's key multipliers (the query times each channel's
//! scale) and a head's weights over a block's rows (softmax weight times each row's scale) are
//! rounded to i16 with one step per head and block, and `vpmaddwd` multiplies sixteen codes
//! by them and adds the pairs, half the instructions of FMAs over f32 for the same codes. The
//! sums are exact integers, so every query that reads a block gets the same bits whatever its
//! tile. The step is the largest `|query|` (or weight) times the block's largest scale over
//! 32767, known without a pass over the products; the multipliers keep up to 15 bits, far more
//! than the codes' own 8. Int4 blocks take byte multipliers instead (`attention_int4.rs`),
//! dispatched from here.
//!
//! The blocks are laid out for it (`kv_levels.rs`): keys as channel pairs over the block's rows,
//! values as row pairs over the channels. A pair multiply-add then sums along the dot
//! product's own axis, and each of a register's eight lanes ends with one row's score (keys) or
//! one channel's sum (values): no horizontal sums.

use super::attention_int4::{int4_dots, int4_weighted_sum};
use crate::kv_cache::BLOCK_TOKENS;
use crate::kv_levels::{BlockRows, RowData};
use half::f16;
use std::arch::x86_64::*;

/// The largest i16 multiplier. Codes are within +-127, so a head of up to `MAX_HEAD_DIM`
/// channels sums to at most 512 * 127 * 32767 < 2^31: an i32 lane cannot overflow.
const MULTIPLIER_MAX: f32 = 32767.0;
pub(super) const MAX_HEAD_DIM: usize = 512;

/// Int8 codes of a block's KV head ([`crate::kv_levels::key8_at`],
/// [`crate::kv_levels::value8_at`]) as the kernels load them: sixteen at a time into i16 lanes,
/// the pairs that one multiply-add sums side by side.
#[derive(Clone, Copy)]
struct Int8(*const i8);

impl Int8 {
    /// Keys of channel pair `p`: rows 0..8, then rows 8..16, each row's two channels together.
    ///
    /// # Safety
    /// `p < head_dim / 2`; the CPU must have AVX2.
    #[inline(always)]
    unsafe fn key_rows(self, p: usize) -> [__m256i; 2] {
        // SAFETY: pair p's rows t0..t0+8 are the 16 bytes from (p * BLOCK_TOKENS + t0) * 2.
        let at = |t0: usize| unsafe {
            _mm256_cvtepi8_epi16(_mm_loadu_si128(self.0.add((p * BLOCK_TOKENS + t0) * 2).cast()))
        };
        [at(0), at(BLOCK_TOKENS / 2)]
    }

    /// Values of row pair `j`: channels `c..c+8`, then `c+8..c+16` when `wide` (else zero), each
    /// channel's two rows together.
    ///
    /// # Safety
    /// `j < BLOCK_TOKENS / 2` and `c + 16 <= hd` (`c + 8` when not `wide`); AVX2.
    #[inline(always)]
    unsafe fn value_channels(self, j: usize, c: usize, hd: usize, wide: bool) -> [__m256i; 2] {
        // SAFETY: row pair j's channels c..c+8 are the 16 bytes from (j * hd + c) * 2.
        let at = |c: usize| unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(self.0.add((j * hd + c) * 2).cast())) };
        [at(c), if wide { at(c + 8) } else { _mm256_setzero_si256() }]
    }
}

/// For each of `heads` query heads `h` (rows of `hd` in `q`) and each row `s` in `a..b` of a
/// block of int8 or int4 keys (`rows`; a key is `min[c] + code * scale[c]` per channel, int8
/// has no minimum): `out[h * stride + s - a] = scale * q[h] . key s`. `fold` holds the heads'
/// multipliers.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn integer_dots(
    rows: &BlockRows<'_>,
    (a, b): (usize, usize),
    hd: usize,
    q: &[f32],
    heads: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
    fold: &mut Vec<f32>,
) {
    let channel_scale = rows.scale.expect("codes have scales");
    assert!(hd.is_multiple_of(8) && hd <= MAX_HEAD_DIM && a <= b && b <= BLOCK_TOKENS);
    assert!(rows.rows(hd) >= BLOCK_TOKENS && channel_scale.len() >= hd && q.len() >= heads * hd);
    assert!(rows.min.is_none_or(|m| m.len() >= hd));
    assert!(heads == 0 || out.len() >= (heads - 1) * stride + (b - a));
    if a == b {
        return;
    }
    let codes = match rows.data {
        RowData::I8(x) if rows.min.is_none() => Int8(x.as_ptr()),
        RowData::I8(_) => unreachable!("int8 codes have no minimums"),
        RowData::U4(x) => {
            let min = rows.min.expect("int4 codes have minimums");
            // SAFETY: the CPU has AVX2, FMA and F16C; lengths asserted above.
            return unsafe { int4_dots(x, (channel_scale, min), (a, b), hd, q, heads, scale, out, stride, fold) };
        }
        RowData::F16(_) | RowData::F32(_) => unreachable!("only codes take the integer kernels"),
    };
    // fold: each head's multipliers (a pair of i16 in each f32's bits), then its step times
    // `scale`.
    let pairs = hd / 2;
    let (multipliers, steps) = scratch(fold, heads * (pairs + 1)).split_at_mut(heads * pairs);
    // SAFETY: the CPU has AVX2 and F16C; lengths asserted above.
    let top_scale = unsafe { largest_f16(&channel_scale[..hd]) };
    for h in 0..heads {
        let qh = &q[h * hd..][..hd];
        // SAFETY: the CPU has AVX2, FMA and F16C; lengths asserted above.
        unsafe {
            let bound = largest_abs(qh) * top_scale;
            steps[h] = quantize_pairs(qh, &channel_scale[..hd], &mut multipliers[h * pairs..][..pairs], bound) * scale;
        }
    }
    let mut h = 0;
    while h < heads {
        let (m, st, o) = (&multipliers[h * pairs..], &steps[h..], &mut out[h * stride..]);
        // SAFETY (each call): the block holds `pairs` channel pairs of BLOCK_TOKENS rows, m and
        // st the next heads' multipliers and steps, and o their rows a..b (asserted above).
        h += unsafe { up_to_four!(heads - h, H, key_dots::<H>(codes, (a, b), pairs, m, st, o, stride)) };
    }
}

/// [`integer_dots`] for `H` heads; returns `H`. Rows in two halves of eight, one lane a row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn key_dots<const H: usize>(
    codes: Int8,
    (a, b): (usize, usize),
    pairs: usize,
    multipliers: &[f32],
    steps: &[f32],
    out: &mut [f32],
    stride: usize,
) -> usize {
    let mp = multipliers.as_ptr();
    // SAFETY (every access): head h's multipliers at h * pairs + p inside `multipliers`; the
    // codes' pairs as the caller says.
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); 2]; H];
        for p in 0..pairs {
            let x = codes.key_rows(p);
            for (h, acc) in acc.iter_mut().enumerate() {
                let m = _mm256_castps_si256(_mm256_broadcast_ss(&*mp.add(h * pairs + p)));
                acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(x[0], m));
                acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(x[1], m));
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            store_scores(acc, (steps[h], 0.0), (a, b), &mut out[h * stride..][..b - a]);
        }
    }
    H
}

/// For each of `heads` query heads `h`: `out[h] += sum over rows s in a..b of
/// weights[h * stride + s - a] * value s`, over a block of int8 or int4 values (`rows`; a value
/// is `min + code * scale` with one pair per row and group of `rows.group` channels, laid out
/// `[groups][BLOCK_TOKENS]`; int8 has one group and no minimum; `out` rows of `hd`). `fold`
/// holds the heads' multipliers.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn integer_weighted_sum(
    rows: &BlockRows<'_>,
    (a, b): (usize, usize),
    hd: usize,
    weights: &[f32],
    stride: usize,
    heads: usize,
    out: &mut [f32],
    fold: &mut Vec<f32>,
) {
    let row_scale = rows.scale.expect("codes have scales");
    // A 16- or 8-channel step of the kernel lies in one group.
    let group = rows.group;
    assert!(group == hd || group.is_multiple_of(16));
    let groups = hd.div_ceil(group);
    assert!(hd.is_multiple_of(8) && hd <= MAX_HEAD_DIM && a <= b && b <= BLOCK_TOKENS);
    assert!(rows.rows(hd) >= BLOCK_TOKENS && row_scale.len() >= groups * BLOCK_TOKENS && out.len() >= heads * hd);
    assert!(rows.min.is_none_or(|m| m.len() >= groups * BLOCK_TOKENS));
    assert!(heads == 0 || weights.len() >= (heads - 1) * stride + (b - a));
    if a == b {
        return;
    }
    let codes = match rows.data {
        RowData::I8(x) if group == hd && rows.min.is_none() => Int8(x.as_ptr()),
        RowData::I8(_) => unreachable!("int8 values have one group and no minimums"),
        RowData::U4(x) => {
            let min = rows.min.expect("int4 codes have minimums");
            // SAFETY: the CPU has AVX2, FMA and F16C; lengths asserted above.
            return unsafe {
                int4_weighted_sum(x, (row_scale, min, group), (a, b), hd, weights, stride, heads, out, fold)
            };
        }
        RowData::F16(_) | RowData::F32(_) => unreachable!("only codes take the integer kernels"),
    };
    // fold: each head's multipliers for the block's row pairs, then their steps.
    let pairs = BLOCK_TOKENS / 2;
    let (multipliers, steps) = scratch(fold, heads * (pairs + 1)).split_at_mut(heads * pairs);
    let mut w = [0f32; BLOCK_TOKENS];
    let scales = &row_scale[..BLOCK_TOKENS];
    // SAFETY: the CPU has AVX2 and F16C; lengths asserted above.
    let top_scale = unsafe { largest_f16(scales) };
    for h in 0..heads {
        block_weights(&weights[h * stride..][..b - a], (a, b), &mut w);
        // SAFETY: the CPU has AVX2, FMA and F16C; lengths asserted above.
        unsafe {
            let bound = largest_abs(&w) * top_scale;
            steps[h] = quantize_pairs(&w, scales, &mut multipliers[h * pairs..][..pairs], bound);
        }
    }
    let mut h = 0;
    while h < heads {
        let (m, st, o) = (&multipliers[h * pairs..], &steps[h..], &mut out[h * hd..]);
        // SAFETY (each call): as in `integer_dots`; o holds the next heads' rows of hd.
        h += unsafe { up_to_four!(heads - h, H, value_sums::<H>(codes, (a, b), hd, m, st, o)) };
    }
}

/// [`integer_weighted_sum`] for `H` heads; returns `H`. Sixteen channels at a time (eight at
/// the end of a head_dim that is not a multiple of 16), one lane a channel, over the row pairs
/// that hold rows of a..b.
#[inline(always)]
unsafe fn value_sums<const H: usize>(
    codes: Int8,
    (a, b): (usize, usize),
    hd: usize,
    multipliers: &[f32],
    steps: &[f32],
    out: &mut [f32],
) -> usize {
    let pairs = BLOCK_TOKENS / 2;
    let (mp, op) = (multipliers.as_ptr(), out.as_mut_ptr());
    // SAFETY (every access): head h's multipliers at h * pairs + j, its outputs at h * hd +
    // c..+16 (or +8); the codes as the caller says.
    unsafe {
        let (zero, mut c) = (_mm256_setzero_ps(), 0);
        while c < hd {
            let wide = c + 16 <= hd;
            let mut acc = [[_mm256_setzero_si256(); 2]; H];
            for j in a / 2..b.div_ceil(2) {
                let x = codes.value_channels(j, c, hd, wide);
                for (h, acc) in acc.iter_mut().enumerate() {
                    let m = _mm256_castps_si256(_mm256_broadcast_ss(&*mp.add(h * pairs + j)));
                    acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(x[0], m));
                    acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(x[1], m));
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                let step = _mm256_set1_ps(steps[h]);
                for (i, acc) in acc.iter().enumerate().take(if wide { 2 } else { 1 }) {
                    add_sums(*acc, (step, zero), op.add(h * hd + c + i * 8));
                }
            }
            c += if wide { 16 } else { 8 };
        }
    }
    H
}

/// The first `len` values of `fold`, which only grows: the kernels write every value they read,
/// and shrinking it between a block's scores and its weighted sum cost a memset a block (3% of
/// the kernels' time).
#[inline(always)]
pub(super) fn scratch(fold: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if fold.len() < len {
        fold.resize(len, 0.0);
    }
    &mut fold[..len]
}

/// A block's rows `a..b` of one head's weights (`row`) in place in `w`, the other rows 0:
/// their codes are multiplied by nothing.
#[inline(always)]
pub(super) fn block_weights(row: &[f32], (a, b): (usize, usize), w: &mut [f32; BLOCK_TOKENS]) {
    if b - a == BLOCK_TOKENS {
        // A whole block: a copy of known length, no call to memmove.
        w.copy_from_slice(&row[..BLOCK_TOKENS]);
    } else {
        w.fill(0.0);
        w[a..b].copy_from_slice(row);
    }
}

/// A head's scores of rows `a..b` into `out` from its exact sums over the block's rows 0..8
/// and 8..16: `sum * step + bias`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline(always)]
pub(super) unsafe fn store_scores(
    acc: &[__m256i; 2],
    (step, bias): (f32, f32),
    (a, b): (usize, usize),
    out: &mut [f32],
) {
    // SAFETY: register-only; the caller's CPU has AVX2 and FMA.
    unsafe {
        let (step, bias) = (_mm256_set1_ps(step), _mm256_set1_ps(bias));
        let score = [
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[0]), step, bias),
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[1]), step, bias),
        ];
        store_rows(&score, (a, b), out);
    }
}

/// A head's scores of the block's rows 0..8 and 8..16, those of rows `a..b` into `out`.
///
/// # Safety
/// The CPU must have AVX.
#[inline(always)]
pub(super) unsafe fn store_rows(score: &[__m256; 2], (a, b): (usize, usize), out: &mut [f32]) {
    let half = BLOCK_TOKENS / 2;
    // SAFETY: out holds b - a rows; register-only otherwise.
    unsafe {
        if b - a == BLOCK_TOKENS {
            // A whole block (most of them): straight to the output; a copy of a run whose
            // length is not known here is a call to memmove.
            _mm256_storeu_ps(out.as_mut_ptr(), score[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(half), score[1]);
        } else {
            let mut rows = [0f32; BLOCK_TOKENS];
            _mm256_storeu_ps(rows.as_mut_ptr(), score[0]);
            _mm256_storeu_ps(rows.as_mut_ptr().add(half), score[1]);
            out.copy_from_slice(&rows[a..b]);
        }
    }
}

/// Eight channels' exact sums over a block, scaled, added to a head's output at `o`:
/// `o += sum * step + bias`.
///
/// # Safety
/// Eight f32 at `o`; the CPU must have AVX2 and FMA.
#[inline(always)]
pub(super) unsafe fn add_sums(acc: __m256i, (step, bias): (__m256, __m256), o: *mut f32) {
    // SAFETY: as the caller says.
    unsafe {
        let sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), step, _mm256_loadu_ps(o));
        _mm256_storeu_ps(o, _mm256_add_ps(sum, bias));
    }
}

/// The largest of `x`'s magnitudes (`x.len()` a multiple of 8; NaN lanes are skipped).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn largest_abs(x: &[f32]) -> f32 {
    assert!(x.len().is_multiple_of(8));
    // SAFETY (every access): c + 8 <= len.
    unsafe {
        let mut top = _mm256_setzero_ps();
        for c in (0..x.len()).step_by(8) {
            top = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0), _mm256_loadu_ps(x.as_ptr().add(c))), top);
        }
        hmax(top)
    }
}

/// The largest of `x`'s magnitudes, widened from f16 (`x.len()` a multiple of 8).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn largest_f16(x: &[f16]) -> f32 {
    assert!(x.len().is_multiple_of(8));
    // SAFETY (every access): c + 8 <= len.
    unsafe {
        let mut top = _mm256_setzero_ps();
        for c in (0..x.len()).step_by(8) {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(c).cast()));
            top = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0), v), top);
        }
        hmax(top)
    }
}

/// The largest of eight lanes.
#[inline(always)]
pub(super) unsafe fn hmax(v: __m256) -> f32 {
    // SAFETY: register-only; the caller's CPU has AVX.
    unsafe {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }
}

/// `x * scale` (lanes of f32 times f16 scales, of one length, a multiple of 8) rounded to i16
/// multipliers with one step, `bound / MULTIPLIER_MAX`, stored as pairs (the even index in the
/// low half) in the bits of `out`'s f32s; returns the step (0 when `bound` is 0 or not finite).
/// `bound` is at least every product's magnitude: the largest `|x|` times the largest scale,
/// known without a pass over the products (a product below it keeps fewer of the 15 bits).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn quantize_pairs(x: &[f32], scale: &[f16], out: &mut [f32], bound: f32) -> f32 {
    let n = x.len();
    assert!(n.is_multiple_of(8) && scale.len() == n && out.len() == n / 2);
    if !(bound > 0.0 && bound.is_finite()) {
        out.fill(0.0);
        return 0.0;
    }
    let (xp, sp, op) = (x.as_ptr(), scale.as_ptr(), out.as_mut_ptr());
    // SAFETY (every access): c + 8 <= n inside x and scale; c / 2 + 4 (or + 8) <= n / 2
    // inside out.
    unsafe {
        let inv = _mm256_set1_ps(MULTIPLIER_MAX / bound);
        // x[c..c+8] times scale[c..c+8] over the step.
        let rounded = |c: usize| {
            let s = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(c).cast()));
            _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xp.add(c)), s), inv))
        };
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
        bound / MULTIPLIER_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_levels::{key4_at, key8_at, value4_at, value8_at};

    /// A block's keys and values of one KV head as int8 and int4 codes in their layouts, with
    /// their scales (and int4's minimums), and queries.
    struct Case {
        k8: Vec<i8>,
        v8: Vec<i8>,
        k4: Vec<u8>,
        v4: Vec<u8>,
        /// Code at (row, channel), for the reference sums.
        key: Vec<Vec<i32>>,
        value: Vec<Vec<i32>>,
        k4_code: Vec<Vec<i32>>,
        v4_code: Vec<Vec<i32>>,
        channel: Vec<f16>,
        channel_min: Vec<f16>,
        /// Values' scales and minimums, `[groups][BLOCK_TOKENS]` (int8: group 0 only).
        row: Vec<f16>,
        row_min: Vec<f16>,
        q: Vec<f32>,
    }

    const GROUP: usize = 32;

    /// Codes, their scales and queries, with outliers in a channel and a row as real caches
    /// have.
    fn case(hd: usize, heads: usize) -> Case {
        let groups = hd.div_ceil(GROUP);
        let code = |i: usize| (i * 7919 % 255) as i32 - 127;
        let key: Vec<Vec<i32>> = (0..BLOCK_TOKENS).map(|t| (0..hd).map(|c| code(t * hd + c)).collect()).collect();
        let value: Vec<Vec<i32>> =
            (0..BLOCK_TOKENS).map(|t| (0..hd).map(|c| code((t * hd + c) * 31 + 5)).collect()).collect();
        let nibble = |x: i32| x.rem_euclid(16);
        let k4_code: Vec<Vec<i32>> = key.iter().map(|r| r.iter().map(|&x| nibble(x)).collect()).collect();
        let v4_code: Vec<Vec<i32>> = value.iter().map(|r| r.iter().map(|&x| nibble(x * 3)).collect()).collect();
        let (mut k8, mut v8) = (vec![0i8; BLOCK_TOKENS * hd], vec![0i8; BLOCK_TOKENS * hd]);
        let (mut k4, mut v4) = (vec![0u8; BLOCK_TOKENS * hd / 2], vec![0u8; BLOCK_TOKENS * hd / 2]);
        let put =
            |xs: &mut [u8], (byte, high): (usize, bool), x: i32| xs[byte] |= (x as u8) << if high { 4 } else { 0 };
        for t in 0..BLOCK_TOKENS {
            for c in 0..hd {
                k8[key8_at(t, c)] = key[t][c] as i8;
                v8[value8_at(t, c, hd)] = value[t][c] as i8;
                put(&mut k4, key4_at(t, c, hd), k4_code[t][c]);
                put(&mut v4, value4_at(t, c, hd), v4_code[t][c]);
            }
        }
        let channel: Vec<f16> =
            (0..hd).map(|c| f16::from_f32(if c == 3 { 0.2 } else { 0.01 + c as f32 * 1e-4 })).collect();
        let channel_min: Vec<f16> = (0..hd).map(|c| f16::from_f32((c as f32 * 0.7).sin() * 0.3)).collect();
        let row: Vec<f16> = (0..groups * BLOCK_TOKENS)
            .map(|i| f16::from_f32(if i % BLOCK_TOKENS == 6 { 0.05 } else { 0.008 + (i / BLOCK_TOKENS) as f32 * 1e-3 }))
            .collect();
        let row_min: Vec<f16> =
            (0..groups * BLOCK_TOKENS).map(|i| f16::from_f32((i as f32 * 0.9).cos() * 0.1)).collect();
        let q: Vec<f32> = (0..heads * hd).map(|i| ((i * 13) as f32 * 0.37).sin() * 2.0).collect();
        Case { k8, v8, k4, v4, key, value, k4_code, v4_code, channel, channel_min, row, row_min, q }
    }

    #[test]
    fn integer_dots_and_weighted_sums_match_f64_over_the_dequantized_block() {
        if !crate::kernels::simd() {
            return;
        }
        for hd in [64usize, 72, 256] {
            let groups = hd.div_ceil(GROUP);
            for heads in 1..=5 {
                let c = case(hd, heads);
                // (keys, values, key codes, value codes, channels a value group, largest code)
                let int8 = (
                    BlockRows { data: RowData::I8(&c.k8), scale: Some(&c.channel), min: None, group: hd },
                    BlockRows { data: RowData::I8(&c.v8), scale: Some(&c.row), min: None, group: hd },
                    &c.key,
                    &c.value,
                    127.0,
                    (MULTIPLIER_MAX as f64, MULTIPLIER_MAX as f64),
                    // Int8's step comes from a bound on the products, int4's from the largest.
                    false,
                );
                let int4 = (
                    BlockRows {
                        data: RowData::U4(&c.k4),
                        scale: Some(&c.channel),
                        min: Some(&c.channel_min),
                        group: hd,
                    },
                    BlockRows { data: RowData::U4(&c.v4), scale: Some(&c.row), min: Some(&c.row_min), group: GROUP },
                    &c.k4_code,
                    &c.v4_code,
                    15.0,
                    // Int4's multipliers are bytes (`attention_int4.rs`).
                    (127.0, 255.0),
                    true,
                );
                for (keys, values, key, value, largest_code, (key_max, value_max), exact) in [int8, int4] {
                    let group = values.group;
                    let key_at = |s: usize, ch: usize| {
                        keys.min.map_or(0.0, |m| m[ch].to_f64()) + key[s][ch] as f64 * c.channel[ch].to_f64()
                    };
                    let value_at = |s: usize, ch: usize| {
                        let at = ch / group * BLOCK_TOKENS + s;
                        values.min.map_or(0.0, |m| m[at].to_f64()) + value[s][ch] as f64 * c.row[at].to_f64()
                    };
                    for (a, b) in [(0, 16), (3, 16), (0, 5), (9, 16), (5, 11), (7, 8), (4, 4)] {
                        let stride = 20;
                        let mut scores = vec![f32::NAN; heads * stride];
                        let mut fold = Vec::new();
                        // SAFETY: simd() found AVX2, FMA and F16C.
                        unsafe { integer_dots(&keys, (a, b), hd, &c.q, heads, 0.125, &mut scores, stride, &mut fold) };
                        let weights: Vec<f32> =
                            (0..heads * stride).map(|i| ((i * 5) as f32 * 0.3).cos().abs() / 8.0).collect();
                        let mut out: Vec<f32> = (0..heads * hd).map(|i| i as f32 * 0.001).collect();
                        let before = out.clone();
                        // SAFETY: as above.
                        unsafe {
                            integer_weighted_sum(&values, (a, b), hd, &weights, stride, heads, &mut out, &mut fold)
                        };
                        for h in 0..heads {
                            let qh = &c.q[h * hd..][..hd];
                            for s in a..b {
                                let want = (0..hd).map(|ch| qh[ch] as f64 * key_at(s, ch)).sum::<f64>() * 0.125;
                                let got = scores[h * stride + s - a] as f64;
                                // Each multiplier is within half a step (1/key_max of the largest
                                // product of its run of 32 channels, or of the largest |query|
                                // times the largest scale) of query times scale, each code within
                                // its range; and f32's rounding.
                                let top = |x: &mut dyn Iterator<Item = f64>| x.map(f64::abs).fold(0f64, f64::max);
                                let scales = || c.channel[..hd].iter().map(|x| x.to_f64());
                                let largest = |ch: usize| {
                                    if exact {
                                        let run = ch / 32 * 32..hd.min(ch / 32 * 32 + 32);
                                        top(&mut run.map(|i| qh[i] as f64 * c.channel[i].to_f64()))
                                    } else {
                                        top(&mut qh.iter().map(|&x| x as f64)) * top(&mut scales())
                                    }
                                };
                                let bound =
                                    (0..hd).map(|ch| 0.125 * 0.5 * largest(ch) / key_max * largest_code).sum::<f64>()
                                        + 1e-6 * (0..hd).map(|ch| (qh[ch] as f64 * key_at(s, ch)).abs()).sum::<f64>();
                                assert!(
                                    (got - want).abs() <= bound,
                                    "hd {hd} heads {heads} ({a},{b}) h {h} s {s}: {got} vs {want}"
                                );
                            }
                            assert!(
                                scores[h * stride + (b - a)..][..stride - (b - a)].iter().all(|x| x.is_nan()),
                                "rows past b untouched"
                            );
                            for ch in 0..hd {
                                let w = |s: usize| weights[h * stride + s - a] as f64;
                                let want =
                                    before[h * hd + ch] as f64 + (a..b).map(|s| w(s) * value_at(s, ch)).sum::<f64>();
                                let size: f64 = (a..b)
                                    .map(|s| {
                                        w(s) * (c.row[ch / group * BLOCK_TOKENS + s].to_f64() * largest_code + 1.0)
                                    })
                                    .sum();
                                // Each row's multiplier within half a step: the largest weight times
                                // scale of the channel's group (or the largest weight times the
                                // largest scale) over value_max.
                                let row_scale = |g: usize, s: usize| c.row[g * BLOCK_TOKENS + s].to_f64();
                                let top = if exact {
                                    (a..b).map(|s| w(s) * row_scale(ch / group, s)).fold(0f64, f64::max)
                                } else {
                                    (a..b).map(w).fold(0f64, f64::max)
                                        * c.row[..groups * BLOCK_TOKENS].iter().map(|x| x.to_f64()).fold(0f64, f64::max)
                                };
                                let step = top / value_max;
                                let rounding = (b - a) as f64 * 0.5 * step * largest_code;
                                let got = out[h * hd + ch] as f64;
                                assert!(
                                    (got - want).abs() <= rounding + 2e-4 * size + 1e-5,
                                    "values hd {hd} heads {heads} groups {groups} ({a},{b}) h {h} c {ch}: {got} vs {want}"
                                );
                            }
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
        let c = case(hd, 1);
        let int8 = (
            BlockRows { data: RowData::I8(&c.k8), scale: Some(&c.channel), min: None, group: hd },
            BlockRows { data: RowData::I8(&c.v8), scale: Some(&c.row), min: None, group: hd },
        );
        let zero = vec![f16::ZERO; hd];
        let int4 = (
            BlockRows { data: RowData::U4(&c.k4), scale: Some(&c.channel), min: Some(&zero), group: hd },
            BlockRows { data: RowData::U4(&c.v4), scale: Some(&c.row), min: Some(&zero[..32]), group: GROUP },
        );
        for (keys, values) in [int8, int4] {
            let (mut scores, mut out, mut fold) = (vec![1f32; BLOCK_TOKENS], vec![0.5f32; hd], Vec::new());
            // SAFETY: simd() found AVX2, FMA and F16C.
            unsafe {
                integer_dots(&keys, (0, 16), hd, &[0.0; 64], 1, 1.0, &mut scores, 16, &mut fold);
                integer_weighted_sum(&values, (0, 16), hd, &[0.0; 16], 16, 1, &mut out, &mut fold);
            }
            assert!(scores.iter().all(|&x| x == 0.0) && out.iter().all(|&x| x == 0.5));
        }
    }

    /// Kernel time per block (scores and weighted sum of one KV head read by its query heads) at
    /// f16, int8 and int4, over as many blocks as 8 sequences of 4,096 tokens hold, each block its
    /// own copy, in two shapes: head_dim 64 read by 3 heads (SmolLM2) and 256 by 4 (Gemma 3):
    /// `cargo test --release -p llmr-native-engine --lib kernels::attention_integer::tests::bench
    /// -- --ignored --nocapture` (`BENCH_ROUNDS`, default 7, rounds over all blocks; medians).
    #[test]
    #[ignore]
    fn bench() {
        if !crate::kernels::simd() {
            return;
        }
        let rounds: usize =
            std::env::var("BENCH_ROUNDS").map_or(7, |r| r.parse().expect("BENCH_ROUNDS: a count")).max(1);
        for (hd, heads) in [(64usize, 3usize), (256, 4)] {
            bench_shape(hd, heads, rounds);
        }
    }

    fn bench_shape(hd: usize, heads: usize, rounds: usize) {
        use crate::kernels::attention_avx2::{attention_dots, attention_weighted_sum};
        let blocks = 8 * 4096 / BLOCK_TOKENS;
        let c = case(hd, heads);
        let f16s: Vec<f16> = (0..BLOCK_TOKENS * hd).map(|i| f16::from_f32((i as f32 * 0.01).sin())).collect();
        let copies = |x: &[f16]| vec![x.to_vec(); blocks];
        let (kf, vf) = (copies(&f16s), copies(&f16s));
        let (k8, v8) = (vec![c.k8.clone(); blocks], vec![c.v8.clone(); blocks]);
        let (k4, v4) = (vec![c.k4.clone(); blocks], vec![c.v4.clone(); blocks]);
        let rows = |data, scale, min, group| BlockRows { data, scale, min, group };
        let levels: [(&str, Vec<(BlockRows<'_>, BlockRows<'_>)>); 3] = [
            (
                "f16",
                (0..blocks)
                    .map(|i| (rows(RowData::F16(&kf[i]), None, None, hd), rows(RowData::F16(&vf[i]), None, None, hd)))
                    .collect(),
            ),
            (
                "int8",
                (0..blocks)
                    .map(|i| {
                        let keys = rows(RowData::I8(&k8[i]), Some(&c.channel[..]), None, hd);
                        (keys, rows(RowData::I8(&v8[i]), Some(&c.row[..]), None, hd))
                    })
                    .collect(),
            ),
            (
                "int4",
                (0..blocks)
                    .map(|i| {
                        let keys = rows(RowData::U4(&k4[i]), Some(&c.channel[..]), Some(&c.channel_min[..]), hd);
                        (keys, rows(RowData::U4(&v4[i]), Some(&c.row[..]), Some(&c.row_min[..]), GROUP))
                    })
                    .collect(),
            ),
        ];
        let weights = vec![1.0f32 / 16.0; heads * BLOCK_TOKENS];
        let (mut scores, mut out, mut fold) = (vec![0f32; heads * BLOCK_TOKENS], vec![0f32; heads * hd], Vec::new());
        for (name, blocks) in &levels {
            let mut times: Vec<f64> = (0..rounds)
                .map(|_| {
                    let start = std::time::Instant::now();
                    for (keys, values) in blocks {
                        // SAFETY: simd() found AVX2, FMA and F16C.
                        unsafe {
                            attention_dots(keys, (0, 16), hd, &c.q, heads, 0.125, &mut scores, 16, &mut fold);
                            attention_weighted_sum(values, (0, 16), hd, &weights, 16, heads, &mut out, &mut fold);
                        }
                    }
                    start.elapsed().as_secs_f64() * 1e9 / blocks.len() as f64
                })
                .collect();
            times.sort_by(f64::total_cmp);
            let (low, mid, high) = (times[0], times[rounds / 2], times[rounds - 1]);
            println!(
                "head_dim {hd}, {heads} heads, {name}: {mid:.0} ns a block (min {low:.0}, max {high:.0}); checksum {}",
                out[0] + scores[0]
            );
        }
    }
}
