//! AVX2 + FMA kernels of attention over one block of the KV cache: the scores of a group of
//! query heads against the block's keys, their weighted sums of its values, and the softmax
//! between. They read f16 blocks where they lie, widened in registers (`BlockRows`), so a
//! decoding token's tile makes no f32 copy of the block; int8 and int4 blocks go to the integer
//! kernels of `attention_integer.rs` instead. The query heads that share a KV head (grouped
//! query attention) are taken together, so each value is widened once for all of them.
//!
//! Per query head, every sum runs in the same order whatever the source: rows read in place
//! give the same bits as the same rows widened to f32 first, and a sequence's logits do not
//! depend on how its tiles were formed.

use super::attention_integer::{integer_dots, integer_weighted_sum};
use super::avx2::hsum;
use crate::kv_levels::{BlockRows, RowData};
use std::arch::x86_64::*;

/// Eight values of one row of a block as f32 (rows of `hd` values, `hd` a multiple of 8).
trait Load8: Copy {
    /// Values `c..c+8` of row `r`.
    ///
    /// # Safety
    /// `r` must be a row of the block and `c + 8 <= hd`; the CPU must have AVX2 and F16C.
    unsafe fn load8(self, r: usize, c: usize) -> __m256;
}

#[derive(Clone, Copy)]
struct F32Rows(*const f32, usize);

impl Load8 for F32Rows {
    #[inline(always)]
    unsafe fn load8(self, r: usize, c: usize) -> __m256 {
        // SAFETY: the caller keeps (r, c) inside the block.
        unsafe { _mm256_loadu_ps(self.0.add(r * self.1 + c)) }
    }
}

#[derive(Clone, Copy)]
struct F16Rows(*const half::f16, usize);

impl Load8 for F16Rows {
    #[inline(always)]
    unsafe fn load8(self, r: usize, c: usize) -> __m256 {
        // SAFETY: as above.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.add(r * self.1 + c) as *const __m128i)) }
    }
}

/// Runs `$call` with `$src` the `Load8` of `$data`'s type.
macro_rules! each_source {
    ($data:expr, $hd:expr, |$src:ident| $call:expr) => {
        match $data {
            RowData::F32(x) => {
                let $src = F32Rows(x.as_ptr(), $hd);
                $call
            }
            RowData::F16(x) => {
                let $src = F16Rows(x.as_ptr(), $hd);
                $call
            }
            RowData::I8(_) | RowData::U4(_) => unreachable!("codes take the integer kernels"),
        }
    };
}

/// Calls `$kernel::<_, H>` for the next `H` (1 to 4) of `$heads` heads from `$h`, on `$rows`'s
/// source; the kernels keep each head's sums in registers. Evaluates to `H`.
macro_rules! four_heads_at_a_time {
    ($rows:expr, $hd:expr, $heads:expr, $h:expr, |$src:ident, $n:ident| $call:expr) => {
        up_to_four!($heads - $h, $n, each_source!($rows.data, $hd, |$src| $call))
    };
}

/// For each of `heads` query heads `h` (rows of `hd` in `q`) and each row `s` of `rows` in
/// `a..b`: `out[h * stride + s - a] = scale * q[h] . key s`. Int8 and int4 codes go to
/// [`integer_dots`], whose multipliers `fold` holds.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn attention_dots(
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
    if matches!(rows.data, RowData::I8(_) | RowData::U4(_)) {
        // SAFETY: the caller's CPU has AVX2, FMA and F16C.
        return unsafe { integer_dots(rows, (a, b), hd, q, heads, scale, out, stride, fold) };
    }
    assert!(rows.scale.is_none() && rows.min.is_none(), "f16 and f32 rows are values, not codes");
    assert!(hd.is_multiple_of(8) && a <= b && b <= rows.rows(hd) && q.len() >= heads * hd);
    assert!(heads == 0 || out.len() >= (heads - 1) * stride + (b - a));
    let mut h = 0;
    while h < heads {
        let (q, out) = (&q[h * hd..], &mut out[h * stride..]);
        // SAFETY (each call): the asserts above keep rows a..b, the heads' queries and their
        // outputs inside the slices; the CPU has AVX2, FMA and F16C.
        h += unsafe {
            four_heads_at_a_time!(rows, hd, heads, h, |src, H| dots::<_, H>(src, (a, b), hd, q, scale, out, stride))
        };
    }
}

/// [`attention_dots`] for `H` heads; returns `H`. Two rows at a time, one sum per (row, head)
/// over the channels in order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dots<R: Load8, const H: usize>(
    src: R,
    (a, b): (usize, usize),
    hd: usize,
    q: &[f32],
    scale: f32,
    out: &mut [f32],
    stride: usize,
) -> usize {
    let qp = q.as_ptr();
    let mut s = a;
    // SAFETY (every access): the caller's asserts cover rows a..b, H query rows of hd, and
    // out[h * stride + s - a] for h < H.
    unsafe {
        while s + 2 <= b {
            let mut acc = [[_mm256_setzero_ps(); 2]; H];
            for c in (0..hd).step_by(8) {
                let x = [src.load8(s, c), src.load8(s + 1, c)];
                for (h, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm256_loadu_ps(qp.add(h * hd + c));
                    acc[0] = _mm256_fmadd_ps(qv, x[0], acc[0]);
                    acc[1] = _mm256_fmadd_ps(qv, x[1], acc[1]);
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                out[h * stride + s - a] = hsum(acc[0]) * scale;
                out[h * stride + s + 1 - a] = hsum(acc[1]) * scale;
            }
            s += 2;
        }
        if s < b {
            let mut acc = [_mm256_setzero_ps(); H];
            for c in (0..hd).step_by(8) {
                let x = src.load8(s, c);
                for (h, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(h * hd + c)), x, *acc);
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                out[h * stride + s - a] = hsum(*acc) * scale;
            }
        }
    }
    H
}

/// For each of `heads` query heads `h`: `out[h] += sum over rows s in a..b of
/// weights[h * stride + s - a] * value s` (`out` rows of `hd`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn attention_weighted_sum(
    rows: &BlockRows<'_>,
    (a, b): (usize, usize),
    hd: usize,
    weights: &[f32],
    stride: usize,
    heads: usize,
    out: &mut [f32],
    fold: &mut Vec<f32>,
) {
    if matches!(rows.data, RowData::I8(_) | RowData::U4(_)) {
        // SAFETY: the caller's CPU has AVX2, FMA and F16C.
        return unsafe { integer_weighted_sum(rows, (a, b), hd, weights, stride, heads, out, fold) };
    }
    assert!(rows.scale.is_none() && rows.min.is_none(), "f16 and f32 rows are values, not codes");
    assert!(hd.is_multiple_of(8) && a <= b && b <= rows.rows(hd) && out.len() >= heads * hd);
    assert!(heads == 0 || weights.len() >= (heads - 1) * stride + (b - a));
    let mut h = 0;
    while h < heads {
        let (w, out) = (&weights[h * stride..], &mut out[h * hd..]);
        // SAFETY (each call): as in `attention_dots`.
        h += unsafe {
            four_heads_at_a_time!(rows, hd, heads, h, |src, H| weighted_sum::<_, H>(src, (a, b), hd, (w, stride), out))
        };
    }
}

/// [`attention_weighted_sum`] for `H` heads; returns `H`. Sixteen channels of every head in
/// registers across the rows, each channel's sum over the rows in order.
#[inline(always)]
unsafe fn weighted_sum<R: Load8, const H: usize>(
    src: R,
    (a, b): (usize, usize),
    hd: usize,
    (weights, stride): (&[f32], usize),
    out: &mut [f32],
) -> usize {
    let (wp, op) = (weights.as_ptr(), out.as_mut_ptr());
    // SAFETY (every access): the caller's asserts cover rows a..b, weights[h * stride + s - a]
    // and out[h * hd + c..+8] for h < H.
    unsafe {
        let w = |h: usize, s: usize| _mm256_set1_ps(*wp.add(h * stride + s - a));
        let mut c = 0;
        while c < hd {
            if c + 16 <= hd {
                let mut acc: [[__m256; 2]; H] = std::array::from_fn(|h| {
                    [_mm256_loadu_ps(op.add(h * hd + c)), _mm256_loadu_ps(op.add(h * hd + c + 8))]
                });
                for s in a..b {
                    let x = [src.load8(s, c), src.load8(s, c + 8)];
                    for (h, acc) in acc.iter_mut().enumerate() {
                        let wv = w(h, s);
                        acc[0] = _mm256_fmadd_ps(wv, x[0], acc[0]);
                        acc[1] = _mm256_fmadd_ps(wv, x[1], acc[1]);
                    }
                }
                for (h, acc) in acc.iter().enumerate() {
                    _mm256_storeu_ps(op.add(h * hd + c), acc[0]);
                    _mm256_storeu_ps(op.add(h * hd + c + 8), acc[1]);
                }
                c += 16;
            } else {
                let mut acc: [__m256; H] = std::array::from_fn(|h| _mm256_loadu_ps(op.add(h * hd + c)));
                for s in a..b {
                    let x = src.load8(s, c);
                    for (h, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm256_fmadd_ps(w(h, s), x, *acc);
                    }
                }
                for (h, acc) in acc.iter().enumerate() {
                    _mm256_storeu_ps(op.add(h * hd + c), *acc);
                }
                c += 8;
            }
        }
    }
    H
}

/// Softmax of `x` in place; a `sink` logit counts in the denominator only. Eight values a
/// register, with [`exp8`] for the exponentials (libm's `expf`, one call per value, was 8% of
/// decode time at context 4096).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn softmax(x: &mut [f32], sink: Option<f32>) {
    let n = x.len();
    let main = n / 8 * 8;
    let p = x.as_mut_ptr();
    // SAFETY (every access): i + 8 <= main <= n keeps the vector accesses inside `x`.
    unsafe {
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..main).step_by(8) {
            m = _mm256_max_ps(m, _mm256_loadu_ps(p.add(i)));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let max = lanes.iter().chain(&x[main..]).copied().fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
        let mv = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_ps();
        for i in (0..main).step_by(8) {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv));
            _mm256_storeu_ps(p.add(i), e);
            sum = _mm256_add_ps(sum, e);
        }
        // The tail (at most 7 values) and the sink in the last lane, through the same
        // exponential as one more register; the lanes between weigh nothing.
        let mut tail = [f32::NEG_INFINITY; 8];
        tail[..n - main].copy_from_slice(&x[main..]);
        tail[7] = sink.unwrap_or(f32::NEG_INFINITY);
        let mut e = [0f32; 8];
        _mm256_storeu_ps(e.as_mut_ptr(), exp8(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), mv)));
        x[main..].copy_from_slice(&e[..n - main]);
        let total = hsum(sum) + e.iter().sum::<f32>();
        let inv = _mm256_set1_ps(1.0 / total);
        for i in (0..main).step_by(8) {
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv));
        }
        for v in &mut x[main..] {
            *v *= 1.0 / total;
        }
    }
}

/// Below this `e^x` is taken as 0 (the smallest normal result is e^-87.34).
pub(super) const EXP_LOWEST: f32 = -87.33;
/// ln 2 in two parts, the first with few enough bits that `n` times it is exact.
pub(super) const EXP_LN2: [f32; 2] = [0.693_359_4, -2.121_944_4e-4];
/// The Cephes polynomial `y(r)`, highest degree first: `e^r = 1 + r + r^2 y(r)`.
pub(super) const EXP_POLY: [f32; 6] =
    [1.987_569_2e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `e^x` for each lane where `x <= 0` (what softmax takes), within about 2 ulp; 0 below the
/// smallest normal result, and for `-inf` (positions that weigh nothing stay at exactly 0).
/// The Cephes method: `x = n ln 2 + r` with `|r| <= ln 2 / 2`, a degree-5 polynomial for
/// `e^r`, and `2^n` put in the exponent bits.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    // SAFETY: register-only operations; the caller runs with AVX2 and FMA.
    unsafe {
        let zero = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_LOWEST));
        let x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LOWEST));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        ));
        // r = x - n ln 2, with ln 2 in two parts so that n * the first is exact.
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2[0]), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2[1]), r);
        let mut y = _mm256_set1_ps(EXP_POLY[0]);
        for c in EXP_POLY[1..].iter().copied() {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        // e^r = 1 + r + r^2 * y
        let y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
        let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_andnot_ps(zero, _mm256_mul_ps(y, pow2n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_matches_the_scalar_one_and_gives_minus_infinity_no_weight() {
        if !crate::kernels::simd() {
            return; // no AVX2 here: the scalar softmax runs instead
        }
        for n in [1, 7, 8, 13, 16, 100] {
            for sink in [None, Some(0.7f32)] {
                let mut x: Vec<f32> = (0..n).map(|i| ((i * 37) as f32 * 0.61).sin() * 20.0).collect();
                if n > 1 {
                    x[n / 2] = f32::NEG_INFINITY; // an evicted position (a row always keeps some)
                }
                if n > 3 {
                    x[n - 1] = -200.0; // below the smallest normal result
                }
                let max = x.iter().copied().fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
                let e: Vec<f64> = x.iter().map(|&v| ((v - max) as f64).exp()).collect();
                let total = e.iter().sum::<f64>() + sink.map_or(0.0, |s| ((s - max) as f64).exp());
                // SAFETY: simd() found AVX2, FMA and F16C.
                unsafe { softmax(&mut x, sink) };
                for (i, (got, e)) in x.iter().zip(&e).enumerate() {
                    let want = e / total;
                    assert!(
                        ((*got as f64) - want).abs() <= 4e-6 * want + 1e-37,
                        "n {n} sink {sink:?} [{i}]: {got} vs {want}"
                    );
                }
                if n > 1 {
                    assert_eq!(x[n / 2], 0.0, "-inf weighs exactly nothing");
                }
            }
        }
    }
}
