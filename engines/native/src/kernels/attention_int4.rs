//! AVX2 kernels of attention over int4 blocks of the KV cache, in byte arithmetic.
//!
//! The int8 kernels (`attention_integer.rs`) multiply codes widened to i16 by i16 multipliers:
//! `vpmaddwd`, 16 products an instruction, about what f16 values cost in FMAs. Int4 codes
//! (0..15) fit a byte, `vpmaddubsw`'s unsigned operand (keys) or its signed one (values), so
//! here the other side is made a byte too: the query times each channel's scale rounded to i8
//! (keys), a head's softmax weights times each row's scale rounded to u8 (values, never
//! negative). `vpmaddubsw` multiplies 32 byte
//! pairs an instruction and adds neighbours into i16, twice `vpmaddwd`'s products, and the
//! unpacked nibbles need no widening. One i16 lane holds at most 2 * 15 * 255 = 7,650, so up
//! to four (values) or eight (keys, 2 * 15 * 127 each) such sums add in i16 before one
//! `vpmaddwd` by ones widens them to i32: the sums stay exact, and every query that reads a
//! block gets the same bits whatever its tile.
//!
//! The multipliers keep 7 (keys) or 8 (values) bits against the codes' 4: their step is the
//! largest product's magnitude (query times scale, or weight times scale) over 127 (or 255),
//! one step per head and block. That is the kind of query rounding llama.cpp's CPU attention
//! makes over quantized keys (q8_0). What it costs, measured with `kv-eval`: 8-13% more mean
//! KLD than i16 multipliers at int4 (`bench/RESULTS.md`).
//!
//! On a decoding token that setup (the products, their largest, the minimum terms) costs more
//! than the codes' arithmetic, so it runs in two passes shared as far as they can be: the
//! first takes up to four heads at once, widening each scale and minimum once for them and
//! keeping the products; the second rounds each head's kept products.
//!
//! Layouts (`kv_levels.rs`): keys in channel quads over the rows (`key4_at`), so a 32-bit lane
//! of the unpacked codes is one row's four channels and each of a register's eight lanes ends
//! with one row's score; values in row quads over the channels (`value4_at`), a lane one
//! channel's four rows, each lane ending with one channel's sum. No horizontal sums.

use super::attention_integer::{add_sums, block_weights, hmax, scratch, store_scores};
use super::avx2::hsum;
use crate::kv_cache::BLOCK_TOKENS;
use half::f16;
use std::arch::x86_64::*;

/// The largest key multiplier (i8) and value multiplier (u8).
const KEY_MULTIPLIER_MAX: f32 = 127.0;
const VALUE_MULTIPLIER_MAX: f32 = 255.0;

/// Row quads of a block: the values' multipliers of one head and group, four bytes each.
const ROW_QUADS: usize = BLOCK_TOKENS / 4;

/// [`super::attention_integer::integer_dots`] over int4 keys `codes` (`min[c] + code * scale[c]`
/// per channel), the caller's asserts made.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `codes` holds the block's `BLOCK_TOKENS * hd / 2`
/// bytes, `channel_scale` and `min` `hd` each, `q` `heads` rows of `hd`, `out` rows `a..b` of
/// each head at `stride`; `hd` a multiple of 8.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn int4_dots(
    codes: &[u8],
    (channel_scale, min): (&[f16], &[f16]),
    (a, b): (usize, usize),
    hd: usize,
    q: &[f32],
    heads: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
    fold: &mut Vec<f32>,
) {
    // fold: each head's multipliers (four i8 in each f32's bits, one channel quad), then its
    // step times `scale`, then its minimum term times `scale`, then its products.
    let quads = hd / 4;
    let (multipliers, rest) = scratch(fold, heads * (quads + 2 + hd)).split_at_mut(heads * quads);
    let (steps, rest) = rest.split_at_mut(heads);
    let (biases, products) = rest.split_at_mut(heads);
    // The products and minimum terms of up to four heads in one pass, each channel's scale and
    // minimum widened once for all of them; `steps` holds each head's largest product until
    // the heads' multipliers are rounded.
    let mut h = 0;
    while h < heads {
        let (qh, p, t, bi) = (&q[h * hd..], &mut products[h * hd..], &mut steps[h..], &mut biases[h..]);
        // SAFETY: the CPU has AVX2, FMA and F16C; the next heads' rows lie in qh and p.
        h += unsafe { up_to_four!(heads - h, H, key_products::<H>(qh, (channel_scale, min), hd, p, t, bi)) };
    }
    for h in 0..heads {
        // SAFETY: the CPU has AVX2; a head's hd products and quads multipliers.
        let step = unsafe {
            round_products::<true>(&products[h * hd..][..hd], steps[h], &mut multipliers[h * quads..][..quads])
        };
        steps[h] = step * scale;
        biases[h] *= scale;
    }
    let mut h = 0;
    while h < heads {
        let (m, st, bi, o) = (&multipliers[h * quads..], &steps[h..], &biases[h..], &mut out[h * stride..]);
        // SAFETY: the block holds `quads` channel quads of 32 bytes; m, st and bi the next
        // heads' multipliers, steps and minimum terms, o their rows a..b.
        h += unsafe { up_to_four!(heads - h, H, key_dots::<H>(codes.as_ptr(), (a, b), quads, m, st, bi, o, stride)) };
    }
}

/// [`int4_dots`] for `H` heads; returns `H`. Rows in two halves of eight, one lane a row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn key_dots<const H: usize>(
    codes: *const u8,
    (a, b): (usize, usize),
    quads: usize,
    multipliers: &[f32],
    steps: &[f32],
    biases: &[f32],
    out: &mut [f32],
    stride: usize,
) -> usize {
    let mp = multipliers.as_ptr();
    // SAFETY (every access): head h's multipliers at h * quads + k inside `multipliers`; quad
    // k's codes the 32 bytes from k * 32.
    unsafe {
        let (mask, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
        let mut acc = [[_mm256_setzero_si256(); 2]; H];
        let mut k = 0;
        while k < quads {
            // Eight quads' i16 sums stay within 8 * 2 * 15 * 127 < 2^15.
            let end = (k + 8).min(quads);
            let mut sum = [[_mm256_setzero_si256(); 2]; H];
            for k in k..end {
                let x = _mm256_loadu_si256(codes.add(k * 2 * BLOCK_TOKENS).cast());
                let x = [_mm256_and_si256(x, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(x), mask)];
                for (h, sum) in sum.iter_mut().enumerate() {
                    let m = _mm256_castps_si256(_mm256_broadcast_ss(&*mp.add(h * quads + k)));
                    sum[0] = _mm256_add_epi16(sum[0], _mm256_maddubs_epi16(x[0], m));
                    sum[1] = _mm256_add_epi16(sum[1], _mm256_maddubs_epi16(x[1], m));
                }
            }
            for (acc, sum) in acc.iter_mut().zip(&sum) {
                acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(sum[0], ones));
                acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(sum[1], ones));
            }
            k = end;
        }
        for (h, acc) in acc.iter().enumerate() {
            store_scores(acc, (steps[h], biases[h]), (a, b), &mut out[h * stride..][..b - a]);
        }
    }
    H
}

/// [`super::attention_integer::integer_weighted_sum`] over int4 values `codes` (`min + code *
/// scale`, one pair per row and group of `group` channels, `[groups][BLOCK_TOKENS]`), the
/// caller's asserts made.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `codes` holds the block's `BLOCK_TOKENS * hd / 2`
/// bytes, `row_scale` and `min` `groups * BLOCK_TOKENS` each, `weights` rows `a..b` of each
/// head at `stride`, `out` `heads` rows of `hd`; `hd` a multiple of 8, `group` of 16 or `hd`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn int4_weighted_sum(
    codes: &[u8],
    (row_scale, min, group): (&[f16], &[f16], usize),
    (a, b): (usize, usize),
    hd: usize,
    weights: &[f32],
    stride: usize,
    heads: usize,
    out: &mut [f32],
    fold: &mut Vec<f32>,
) {
    // fold: each head's multipliers for each group's row quads (four u8 in each f32's bits),
    // then their steps (one a head), then their minimum terms, then each head's products.
    let groups = hd.div_ceil(group);
    let (n, span) = (heads * groups, groups * BLOCK_TOKENS);
    let (multipliers, rest) = scratch(fold, n * (ROW_QUADS + 2) + heads * span).split_at_mut(n * ROW_QUADS);
    let (steps, rest) = rest.split_at_mut(n);
    let (biases, products) = rest.split_at_mut(n);
    let layout = (&row_scale[..span], &min[..span], groups);
    // As in `int4_dots`: up to four heads in one pass; each head's first step holds its
    // largest product until its multipliers are rounded.
    let mut h = 0;
    while h < heads {
        let (w, i) = (&weights[h * stride..], h * groups);
        let (p, t, bi) = (&mut products[h * span..], &mut steps[i..], &mut biases[i..]);
        // SAFETY: the CPU has AVX2, FMA and F16C; the next heads' rows lie in w and p.
        h += unsafe { up_to_four!(heads - h, H, value_products::<H>((w, stride), (a, b), layout, p, t, bi)) };
    }
    for h in 0..heads {
        let i = h * groups;
        // SAFETY: the CPU has AVX2; a head's span products and groups * ROW_QUADS multipliers.
        let step = unsafe {
            round_products::<false>(
                &products[h * span..][..span],
                steps[i],
                &mut multipliers[i * ROW_QUADS..][..span / 4],
            )
        };
        steps[i..i + groups].fill(step);
    }
    let mut h = 0;
    while h < heads {
        let i = h * groups;
        let (m, st, bi, o) = (&multipliers[i * ROW_QUADS..], &steps[i..], &biases[i..], &mut out[h * hd..]);
        // SAFETY: as in `int4_dots`; o holds the next heads' rows of hd.
        h += unsafe { up_to_four!(heads - h, H, value_sums::<H>(codes.as_ptr(), (a, b), (hd, group), m, st, bi, o)) };
    }
}

/// [`int4_weighted_sum`] for `H` heads; returns `H`. Sixteen channels at a time (eight at the
/// end of a head_dim that is not a multiple of 16), one lane a channel, over the row quads
/// that hold rows of a..b.
#[inline(always)]
unsafe fn value_sums<const H: usize>(
    codes: *const u8,
    (a, b): (usize, usize),
    (hd, group): (usize, usize),
    multipliers: &[f32],
    steps: &[f32],
    biases: &[f32],
    out: &mut [f32],
) -> usize {
    let groups = hd.div_ceil(group);
    let (mp, op) = (multipliers.as_ptr(), out.as_mut_ptr());
    // SAFETY (every access): head h's multipliers for group g at (h * groups + g) * ROW_QUADS
    // + j, its outputs at h * hd + c..+16 (or +8); row quad j's codes of channels c.. the 32
    // (or 16) bytes from j * 2 * hd + c * 2.
    unsafe {
        let (mask, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
        let mut c = 0;
        while c < hd {
            let (wide, g) = (c + 16 <= hd, c / group);
            // Four row quads' i16 sums stay within 4 * 2 * 255 * 15 < 2^15.
            let mut sum = [[_mm256_setzero_si256(); 2]; H];
            for j in a / 4..b.div_ceil(4) {
                let at = codes.add(j * 2 * hd + c * 2);
                let x = if wide {
                    let x = _mm256_loadu_si256(at.cast());
                    [_mm256_and_si256(x, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(x), mask)]
                } else {
                    // Channels c..c+4 in the low nibbles, c+4..c+8 in the high ones.
                    let x = _mm_loadu_si128(at.cast());
                    let low = _mm_and_si128(x, _mm256_castsi256_si128(mask));
                    let high = _mm_and_si128(_mm_srli_epi16::<4>(x), _mm256_castsi256_si128(mask));
                    [_mm256_set_m128i(high, low), _mm256_setzero_si256()]
                };
                for (h, sum) in sum.iter_mut().enumerate() {
                    let m = _mm256_castps_si256(_mm256_broadcast_ss(&*mp.add((h * groups + g) * ROW_QUADS + j)));
                    sum[0] = _mm256_add_epi16(sum[0], _mm256_maddubs_epi16(m, x[0]));
                    sum[1] = _mm256_add_epi16(sum[1], _mm256_maddubs_epi16(m, x[1]));
                }
            }
            for (h, sum) in sum.iter().enumerate() {
                let step = _mm256_set1_ps(steps[h * groups + g]);
                let bias = _mm256_set1_ps(biases[h * groups + g]);
                for (i, sum) in sum.iter().enumerate().take(if wide { 2 } else { 1 }) {
                    add_sums(_mm256_madd_epi16(*sum, ones), (step, bias), op.add(h * hd + c + i * 8));
                }
            }
            c += if wide { 16 } else { 8 };
        }
    }
    H
}

/// Pass one of [`int4_dots`]' setup for `H` heads (rows of `hd` in `q`): each head's products
/// `q * scale` into its row of `products`, its largest product's magnitude into `tops[h]`
/// (NaN lanes skipped) and its minimum term `q . min` into `biases[h]`; returns `H`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `hd` a multiple of 8.
#[inline(always)]
unsafe fn key_products<const H: usize>(
    q: &[f32],
    (scale, min): (&[f16], &[f16]),
    hd: usize,
    products: &mut [f32],
    tops: &mut [f32],
    biases: &mut [f32],
) -> usize {
    assert!(q.len() >= H * hd && products.len() >= H * hd && scale.len() >= hd && min.len() >= hd);
    assert!(tops.len() >= H && biases.len() >= H);
    let (qp, pp) = (q.as_ptr(), products.as_mut_ptr());
    // SAFETY (every access): c + 8 <= hd inside scale and min, h * hd + c + 8 inside q and
    // products (asserted).
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let (mut top, mut acc) = ([_mm256_setzero_ps(); H], [_mm256_setzero_ps(); H]);
        for c in (0..hd).step_by(8) {
            let s = _mm256_cvtph_ps(_mm_loadu_si128(scale.as_ptr().add(c).cast()));
            let m = _mm256_cvtph_ps(_mm_loadu_si128(min.as_ptr().add(c).cast()));
            for h in 0..H {
                let x = _mm256_loadu_ps(qp.add(h * hd + c));
                let p = _mm256_mul_ps(x, s);
                _mm256_storeu_ps(pp.add(h * hd + c), p);
                top[h] = _mm256_max_ps(_mm256_andnot_ps(sign, p), top[h]);
                acc[h] = _mm256_fmadd_ps(x, m, acc[h]);
            }
        }
        for h in 0..H {
            tops[h] = hmax(top[h]);
            biases[h] = hsum(acc[h]);
        }
    }
    H
}

/// Pass one of [`int4_weighted_sum`]'s setup for `H` heads (rows `a..b` of each head's
/// weights at `stride`): each head's products `weight * scale` for every group's rows
/// (`[groups][BLOCK_TOKENS]`, as `scale` lies) into its row of `groups * BLOCK_TOKENS` in
/// `products`, its largest product's magnitude into `tops[h * groups]` (NaN lanes skipped),
/// and its minimum terms `weights . min[g]` into `biases[h * groups + g]`; returns `H`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[inline(always)]
unsafe fn value_products<const H: usize>(
    (weights, stride): (&[f32], usize),
    (a, b): (usize, usize),
    (scale, min, groups): (&[f16], &[f16], usize),
    products: &mut [f32],
    tops: &mut [f32],
    biases: &mut [f32],
) -> usize {
    let span = groups * BLOCK_TOKENS;
    assert!(scale.len() >= span && min.len() >= span && products.len() >= H * span);
    assert!(tops.len() >= H * groups && biases.len() >= H * groups);
    // A whole block's weights (all but a sequence's last block) are read where they lie; a
    // part of one is copied into place with zeros around it.
    let mut part = [[0f32; BLOCK_TOKENS]; H];
    let w: [*const f32; H] = std::array::from_fn(|h| {
        let row = &weights[h * stride..][..b - a];
        if b - a == BLOCK_TOKENS {
            row.as_ptr()
        } else {
            block_weights(row, (a, b), &mut part[h]);
            part[h].as_ptr()
        }
    });
    let pp = products.as_mut_ptr();
    // SAFETY (every access): g * BLOCK_TOKENS + r + 8 <= span inside scale and min,
    // h * span + that inside products (asserted), r + 8 <= BLOCK_TOKENS inside w[h].
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let mut top = [_mm256_setzero_ps(); H];
        for g in 0..groups {
            let mut acc = [_mm256_setzero_ps(); H];
            for r in (0..BLOCK_TOKENS).step_by(8) {
                let at = g * BLOCK_TOKENS + r;
                let s = _mm256_cvtph_ps(_mm_loadu_si128(scale.as_ptr().add(at).cast()));
                let m = _mm256_cvtph_ps(_mm_loadu_si128(min.as_ptr().add(at).cast()));
                for h in 0..H {
                    let x = _mm256_loadu_ps(w[h].add(r));
                    let p = _mm256_mul_ps(x, s);
                    _mm256_storeu_ps(pp.add(h * span + at), p);
                    top[h] = _mm256_max_ps(_mm256_andnot_ps(sign, p), top[h]);
                    acc[h] = _mm256_fmadd_ps(x, m, acc[h]);
                }
            }
            for h in 0..H {
                biases[h * groups + g] = hsum(acc[h]);
            }
        }
        for h in 0..H {
            tops[h * groups] = hmax(top[h]);
        }
    }
    H
}

/// `products` (a length that is a multiple of 8) rounded to byte multipliers with one step,
/// `top` (their largest magnitude) over MAX (127 and i8 when `SIGNED`, else 255 and u8),
/// stored in order, four in the bits of each of `out`'s f32s; returns the step (0 when `top`
/// is 0 or not finite).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn round_products<const SIGNED: bool>(products: &[f32], top: f32, out: &mut [f32]) -> f32 {
    let n = products.len();
    assert!(n.is_multiple_of(8) && out.len() == n / 4);
    // The step is the largest product, exactly: with 7 or 8 bits a step from a bound (the
    // largest |x| times the largest scale) left the other channels of a head with an outlier
    // channel too few of them (Qwen2.5's mean KLD at int4 went from 2.2e-3 to 6.3e-3).
    if !(top > 0.0 && top.is_finite()) {
        out.fill(0.0);
        return 0.0;
    }
    let (pp, op) = (products.as_ptr(), out.as_mut_ptr().cast::<u8>());
    // SAFETY (every access): i + 8 <= n inside products; i + 32 <= n bytes inside out, which
    // holds n.
    unsafe {
        let max = if SIGNED { KEY_MULTIPLIER_MAX } else { VALUE_MULTIPLIER_MAX };
        let inv = _mm256_set1_ps(max / top);
        // Products i..i+8 over the step, rounded. A macro, not a closure: closures do not
        // inherit the caller's target features, and an intrinsic called from one is a call.
        macro_rules! rounded {
            ($i:expr) => {
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pp.add($i)), inv))
            };
        }
        let mut i = 0;
        while i + 32 <= n {
            // packs works within 128-bit lanes: the bytes of i..i+4, i+8.., i+16.., i+24..
            // (low lane) and of i+4.., i+12.., i+20.., i+28.. (high lane); the permute puts
            // the groups of four back in order.
            let low = _mm256_packs_epi32(rounded!(i), rounded!(i + 8));
            let high = _mm256_packs_epi32(rounded!(i + 16), rounded!(i + 24));
            let bytes = if SIGNED { _mm256_packs_epi16(low, high) } else { _mm256_packus_epi16(low, high) };
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            _mm256_storeu_si256(op.add(i).cast(), _mm256_permutevar8x32_epi32(bytes, order));
            i += 32;
        }
        // The rest (a head_dim or a group count that is not a multiple of 32), one at a time
        // with the same f32 operation and rounding (to nearest, ties to even).
        let inv = max / top;
        for (i, &p) in products.iter().enumerate().skip(i) {
            let r = (p * inv).round_ties_even();
            *op.add(i) = if SIGNED { r.clamp(-max, max) as i8 as u8 } else { r.clamp(0.0, max) as u8 };
        }
        top / max
    }
}
