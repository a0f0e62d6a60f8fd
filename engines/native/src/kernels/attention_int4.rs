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
//! one step per head, block and 32 channels (a run of eight key quads, whose i16 sums add
//! before they are widened, or a value group). That is the kind of query rounding llama.cpp's
//! CPU attention makes over quantized keys (q8_0), finer. One step a head and block left
//! Gemma 3's 256 channels, beside their largest product, too few bits: its mean KLD at int4
//! was 1.84x that of the AMX tiles, which keep 16-bit queries; with a step per 32 channels it
//! is 1.17x, at 1.08x (head_dim 64) to 1.10x (256) the kernels' time (`bench/RESULTS.md`).
//!
//! On a decoding token that setup (the products, their largest, the minimum terms) costs more
//! than the codes' arithmetic, so it runs in passes shared as far as they can be: the first
//! takes up to four heads at once, widening each scale and minimum once for them, keeping the
//! products and, from each run's largest lanes, reduced eight runs at a time, its step and the
//! factor that rounds it; the second rounds each head's kept products.
//!
//! Layouts (`kv_levels.rs`): keys in channel quads over the rows (`key4_at`), so a 32-bit lane
//! of the unpacked codes is one row's four channels and each of a register's eight lanes ends
//! with one row's score; values in row quads over the channels (`value4_at`), a lane one
//! channel's four rows, each lane ending with one channel's sum. No horizontal sums.

use super::attention_integer::{add_sums, block_weights, scratch, store_rows, MAX_HEAD_DIM};
use super::avx2::hsum;
use crate::kv_cache::BLOCK_TOKENS;
use half::f16;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::slice;

/// The largest key multiplier (i8) and value multiplier (u8).
const KEY_MULTIPLIER_MAX: f32 = 127.0;
const VALUE_MULTIPLIER_MAX: f32 = 255.0;

/// Row quads of a block: the values' multipliers of one head and group, four bytes each.
const ROW_QUADS: usize = BLOCK_TOKENS / 4;

/// Channel quads of keys whose multipliers share a step: the quads whose i16 sums add before
/// they are widened (32 channels).
const STEP_QUADS: usize = 8;

/// The most runs of products with a step of their own in one head's block: keys' runs are 32
/// channels, values' groups (`group`) 16 or more.
const MAX_RUNS: usize = MAX_HEAD_DIM / 16;

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
    // fold: each head's multipliers (four i8 in each f32's bits, one channel quad), then the
    // steps of its runs of STEP_QUADS quads (times `scale` once rounded), then the factors that
    // round them, then its minimum term times `scale`, then its products.
    let quads = hd / 4;
    let runs = quads.div_ceil(STEP_QUADS);
    let (multipliers, rest) = scratch(fold, heads * (quads + 2 * runs + 1 + hd)).split_at_mut(heads * quads);
    let (steps, rest) = rest.split_at_mut(heads * runs);
    let (factors, rest) = rest.split_at_mut(heads * runs);
    let (biases, products) = rest.split_at_mut(heads);
    // The products, steps and minimum terms of up to four heads in one pass, each channel's
    // scale and minimum widened once for all of them.
    let mut h = 0;
    while h < heads {
        let (qh, p, bi) = (&q[h * hd..], &mut products[h * hd..], &mut biases[h..]);
        let rounding = (&mut steps[h * runs..], &mut factors[h * runs..]);
        // SAFETY: the CPU has AVX2, FMA and F16C; the next heads' rows lie in qh and p.
        h += unsafe { up_to_four!(heads - h, H, key_products::<H>(qh, (channel_scale, min), hd, p, rounding, bi)) };
    }
    for h in 0..heads {
        let (p, f) = (&products[h * hd..][..hd], &factors[h * runs..][..runs]);
        // SAFETY: the CPU has AVX2; a head's hd products and quads multipliers.
        unsafe { round_products::<true, { STEP_QUADS * 4 }>(p, f, &mut multipliers[h * quads..][..quads]) };
        biases[h] *= scale;
    }
    steps.iter_mut().for_each(|step| *step *= scale);
    let mut h = 0;
    while h < heads {
        let (m, st, bi, o) = (&multipliers[h * quads..], &steps[h * runs..], &biases[h..], &mut out[h * stride..]);
        // SAFETY: the block holds `quads` channel quads of 32 bytes; m, st and bi the next
        // heads' multipliers, steps and minimum terms, o their rows a..b.
        h += unsafe { up_to_four!(heads - h, H, key_dots::<H>(codes.as_ptr(), (a, b), quads, m, st, bi, o, stride)) };
    }
}

/// [`int4_dots`] for `H` heads (`steps` a head's `quads.div_ceil(STEP_QUADS)` each); returns
/// `H`. Rows in two halves of eight, one lane a row.
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
    let (mp, runs) = (multipliers.as_ptr(), quads.div_ceil(STEP_QUADS));
    // SAFETY (every access): head h's multipliers at h * quads + k inside `multipliers`, its
    // steps at h * runs + k / STEP_QUADS inside `steps`; quad k's codes the 32 bytes from k * 32.
    unsafe {
        let (mask, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
        let mut acc = [[_mm256_setzero_ps(); 2]; H];
        let mut k = 0;
        while k < quads {
            // A run's i16 sums stay within 8 * 2 * 15 * 127 < 2^15, exact; its exact i32 sums
            // then take its step, in the same order for every row.
            let end = (k + STEP_QUADS).min(quads);
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
            for (h, (acc, sum)) in acc.iter_mut().zip(&sum).enumerate() {
                let step = _mm256_broadcast_ss(&steps[h * runs + k / STEP_QUADS]);
                acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sum[0], ones)), step, acc[0]);
                acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sum[1], ones)), step, acc[1]);
            }
            k = end;
        }
        for (h, acc) in acc.iter().enumerate() {
            let bias = _mm256_set1_ps(biases[h]);
            let score = [_mm256_add_ps(acc[0], bias), _mm256_add_ps(acc[1], bias)];
            store_rows(&score, (a, b), &mut out[h * stride..][..b - a]);
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
    // then their steps (one a group), the factors that round them, their minimum terms, then
    // each head's products.
    let groups = hd.div_ceil(group);
    let (n, span) = (heads * groups, groups * BLOCK_TOKENS);
    let (multipliers, rest) = scratch(fold, n * (ROW_QUADS + 3) + heads * span).split_at_mut(n * ROW_QUADS);
    let (steps, rest) = rest.split_at_mut(n);
    let (factors, rest) = rest.split_at_mut(n);
    let (biases, products) = rest.split_at_mut(n);
    let layout = (&row_scale[..span], &min[..span], groups);
    // As in `int4_dots`: up to four heads in one pass.
    let mut h = 0;
    while h < heads {
        let (w, i) = (&weights[h * stride..], h * groups);
        let (p, bi, rounding) = (&mut products[h * span..], &mut biases[i..], (&mut steps[i..], &mut factors[i..]));
        // SAFETY: the CPU has AVX2, FMA and F16C; the next heads' rows lie in w and p.
        h += unsafe { up_to_four!(heads - h, H, value_products::<H>((w, stride), (a, b), layout, p, rounding, bi)) };
    }
    for h in 0..heads {
        let (i, p) = (h * groups, &products[h * span..][..span]);
        // SAFETY: the CPU has AVX2; a head's span products and groups * ROW_QUADS multipliers.
        unsafe {
            round_products::<false, BLOCK_TOKENS>(
                p,
                &factors[i..i + groups],
                &mut multipliers[i * ROW_QUADS..][..span / 4],
            )
        };
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
/// `q * scale` into its row of `products`, each run of `STEP_QUADS` quads' step and factor
/// ([`steps_and_factors`], from the run's largest magnitude, NaN lanes skipped) into
/// `steps[h * runs + run]` and `factors` alike, and its minimum term `q . min` into
/// `biases[h]`; returns `H`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `hd` a multiple of 8.
#[inline(always)]
unsafe fn key_products<const H: usize>(
    q: &[f32],
    (scale, min): (&[f16], &[f16]),
    hd: usize,
    products: &mut [f32],
    (steps, factors): (&mut [f32], &mut [f32]),
    biases: &mut [f32],
) -> usize {
    let (run, runs) = (STEP_QUADS * 4, hd.div_ceil(STEP_QUADS * 4));
    assert!(q.len() >= H * hd && products.len() >= H * hd && scale.len() >= hd && min.len() >= hd);
    assert!(steps.len() >= H * runs && factors.len() >= H * runs && biases.len() >= H);
    assert!(H <= 4 && runs <= MAX_RUNS);
    let (qp, pp) = (q.as_ptr(), products.as_mut_ptr());
    // SAFETY (every access): c + 8 <= hd inside scale and min, h * hd + c + 8 inside q and
    // products, H * runs inside run_tops (asserted), each of those written before the read.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let mut acc = [_mm256_setzero_ps(); H];
        // Each run's largest magnitudes lane by lane, reduced together at the end (not zeroed
        // first: H * runs of them are written, and only those read).
        let mut run_tops = [const { MaybeUninit::<__m256>::uninit() }; 4 * MAX_RUNS];
        for r in 0..runs {
            let mut top = [_mm256_setzero_ps(); H];
            for c in (r * run..hd.min(r * run + run)).step_by(8) {
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
                run_tops[h * runs + r].write(top[h]);
            }
        }
        let run_tops = slice::from_raw_parts(run_tops.as_ptr().cast(), H * runs);
        steps_and_factors::<true>(run_tops, &mut steps[..H * runs], &mut factors[..H * runs]);
        for h in 0..H {
            biases[h] = hsum(acc[h]);
        }
    }
    H
}

/// Pass one of [`int4_weighted_sum`]'s setup for `H` heads (rows `a..b` of each head's
/// weights at `stride`): each head's products `weight * scale` for every group's rows
/// (`[groups][BLOCK_TOKENS]`, as `scale` lies) into its row of `groups * BLOCK_TOKENS` in
/// `products`, each group's step and factor ([`steps_and_factors`], from its largest
/// magnitude, NaN lanes skipped) into `steps[h * groups + g]` and `factors` alike,
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
    (steps, factors): (&mut [f32], &mut [f32]),
    biases: &mut [f32],
) -> usize {
    let span = groups * BLOCK_TOKENS;
    assert!(scale.len() >= span && min.len() >= span && products.len() >= H * span);
    assert!(steps.len() >= H * groups && factors.len() >= H * groups && biases.len() >= H * groups);
    assert!(H <= 4 && groups <= MAX_RUNS);
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
    // h * span + that inside products, H * groups inside group_tops, each written before the
    // read (asserted), r + 8 <= BLOCK_TOKENS inside w[h].
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        // As in `key_products`: each group's largest magnitudes lane by lane, reduced at the end.
        let mut group_tops = [const { MaybeUninit::<__m256>::uninit() }; 4 * MAX_RUNS];
        for g in 0..groups {
            let (mut acc, mut top) = ([_mm256_setzero_ps(); H], [_mm256_setzero_ps(); H]);
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
                group_tops[h * groups + g].write(top[h]);
            }
        }
        let group_tops = slice::from_raw_parts(group_tops.as_ptr().cast(), H * groups);
        steps_and_factors::<false>(group_tops, &mut steps[..H * groups], &mut factors[..H * groups]);
    }
    H
}

/// For each of `v`'s vectors of product magnitudes (none below 0, none NaN), from its largest
/// lane: the step of the byte multipliers that round those products, `largest / MAX` (127 when
/// `SIGNED`, else 255), into `steps`, and the factor that rounds them, `MAX / largest`, into
/// `factors`; both 0 where the largest is 0 or not finite. Eight vectors at a time with their
/// lanes transposed: about 21 instructions find eight largest lanes, where reducing each
/// vector alone costs 7 apiece, and one division serves eight.
///
/// The step comes from the largest product itself: with 7 or 8 bits, a step from a bound (the
/// largest |x| times the largest scale) left the other channels of a head with an outlier
/// channel too few of them (Qwen2.5's mean KLD at int4 went from 2.2e-3 to 6.3e-3). And each
/// run of 32 channels (keys) or group (values) has its own, not each head: a run without a
/// large product keeps its bits (Gemma 3, head_dim 256, lost most of them with one a head).
///
/// # Safety
/// The CPU must have AVX.
#[inline(always)]
unsafe fn steps_and_factors<const SIGNED: bool>(v: &[__m256], steps: &mut [f32], factors: &mut [f32]) {
    assert!(v.len() == steps.len() && v.len() == factors.len());
    let max = _mm256_set1_ps(if SIGNED { KEY_MULTIPLIER_MAX } else { VALUE_MULTIPLIER_MAX });
    // SAFETY: register-only but for the stores of 8 lanes: into `steps` and `factors` through
    // slices of 8 (bounds-checked) for a whole chunk, else into `s` and `f`.
    unsafe {
        for (i, v) in v.chunks(8).enumerate() {
            // Eight vectors in and eight lanes out whole; a last chunk of fewer in loops of 8
            // with a test each, not copies of a length unknown here: those would be calls to
            // memcpy. No closures either: they do not inherit the target features, and each
            // intrinsic in one would be a call.
            let mut x = [_mm256_setzero_ps(); 8];
            if v.len() == 8 {
                x.copy_from_slice(v);
            } else {
                for (j, x) in x.iter_mut().enumerate() {
                    if j < v.len() {
                        *x = v[j];
                    }
                }
            }
            // Within each 128-bit half: pairs of vectors, then quads, then the two halves.
            let mut pair = [_mm256_setzero_ps(); 4];
            for (j, pair) in pair.iter_mut().enumerate() {
                let (a, b) = (x[2 * j], x[2 * j + 1]);
                *pair = _mm256_max_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
            }
            let mut quad = [_mm256_setzero_ps(); 2];
            for (j, quad) in quad.iter_mut().enumerate() {
                let (a, b) = (pair[2 * j], pair[2 * j + 1]);
                *quad = _mm256_max_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xee>(a, b));
            }
            let top = _mm256_max_ps(
                _mm256_permute2f128_ps::<0x20>(quad[0], quad[1]),
                _mm256_permute2f128_ps::<0x31>(quad[0], quad[1]),
            );
            let usable = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GT_OQ>(top, _mm256_setzero_ps()),
                _mm256_cmp_ps::<_CMP_LT_OQ>(top, _mm256_set1_ps(f32::INFINITY)),
            );
            let step = _mm256_and_ps(usable, _mm256_div_ps(top, max));
            let factor = _mm256_and_ps(usable, _mm256_div_ps(max, top));
            if v.len() == 8 {
                _mm256_storeu_ps(steps[i * 8..][..8].as_mut_ptr(), step);
                _mm256_storeu_ps(factors[i * 8..][..8].as_mut_ptr(), factor);
            } else {
                let (mut s, mut f) = ([0f32; 8], [0f32; 8]);
                _mm256_storeu_ps(s.as_mut_ptr(), step);
                _mm256_storeu_ps(f.as_mut_ptr(), factor);
                for j in 0..8 {
                    if j < v.len() {
                        steps[i * 8 + j] = s[j];
                        factors[i * 8 + j] = f[j];
                    }
                }
            }
        }
    }
}

/// `products` rounded to byte multipliers (i8 when `SIGNED`, else u8), stored in order, four in
/// the bits of each of `out`'s f32s. Each run of `RUN` products (a multiple of 8; the last may
/// be shorter) is multiplied by its own factor from [`steps_and_factors`]; a run whose factor
/// is 0 (no usable largest magnitude) gets multipliers 0.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn round_products<const SIGNED: bool, const RUN: usize>(products: &[f32], factors: &[f32], out: &mut [f32]) {
    let n = products.len();
    assert!(n.is_multiple_of(8) && RUN.is_multiple_of(8) && out.len() == n / 4 && n.div_ceil(RUN) == factors.len());
    let max = if SIGNED { KEY_MULTIPLIER_MAX } else { VALUE_MULTIPLIER_MAX };
    let (pp, op) = (products.as_ptr(), out.as_mut_ptr().cast::<u8>());
    // SAFETY (every access): i + 8 <= n inside products, i / RUN < factors.len(); i + 32 <= n
    // bytes inside out, which holds n.
    unsafe {
        // Products i..i+8 (inside one run) times their run's factor, rounded. A macro, not a
        // closure (as in `steps_and_factors`).
        macro_rules! rounded {
            ($i:expr) => {
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pp.add($i)), _mm256_broadcast_ss(&factors[$i / RUN])))
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
        for (i, &p) in products.iter().enumerate().skip(i) {
            let r = (p * factors[i / RUN]).round_ties_even();
            *op.add(i) = if SIGNED { r.clamp(-max, max) as i8 as u8 } else { r.clamp(0.0, max) as u8 };
        }
    }
    for (r, _) in factors.iter().enumerate().filter(|(_, factor)| **factor == 0.0) {
        // Inf or NaN times 0 left codes of their own in this run.
        out[r * RUN / 4..n.min(r * RUN + RUN) / 4].fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each run's multipliers times its own step give back its products within half that step,
    /// the step being the run's largest magnitude over MAX: a run without the head's outlier
    /// keeps its bits. Runs whose largest magnitude is 0 or not finite get step 0 and zeros.
    #[test]
    fn each_run_of_products_is_rounded_with_its_own_step() {
        if !crate::kernels::simd() {
            return;
        }
        fn check<const SIGNED: bool, const RUN: usize>(n: usize) {
            let max = if SIGNED { KEY_MULTIPLIER_MAX } else { VALUE_MULTIPLIER_MAX };
            let mut products: Vec<f32> = (0..n)
                .map(|i| {
                    let x = ((i * 37) as f32 * 0.61).sin() * 0.01 * (1 + i / RUN) as f32;
                    if SIGNED {
                        x
                    } else {
                        x.abs()
                    }
                })
                .collect();
            products[3] = 40.0; // the outlier, in run 0
            let runs = n.div_ceil(RUN);
            // With three runs or more, the last is all zeros and the one before holds an
            // infinity (a query that overflowed).
            if runs >= 3 {
                products[(runs - 1) * RUN..].fill(0.0);
                products[(runs - 2) * RUN + 1] = f32::INFINITY;
            }
            let tops: Vec<f32> = products.chunks(RUN).map(|r| r.iter().fold(0f32, |m, x| m.max(x.abs()))).collect();
            // Each run's magnitudes lane by lane, as the kernels keep them.
            let lanes: Vec<[f32; 8]> = products
                .chunks(RUN)
                .map(|r| {
                    let mut lane = [0f32; 8];
                    for (i, x) in r.iter().enumerate() {
                        lane[i % 8] = lane[i % 8].max(x.abs());
                    }
                    lane
                })
                .collect();
            let (mut steps, mut factors, mut out) = (vec![f32::NAN; runs], vec![f32::NAN; runs], vec![f32::NAN; n / 4]);
            // SAFETY: simd() found AVX2.
            unsafe {
                let v: Vec<__m256> = lanes.iter().map(|l| _mm256_loadu_ps(l.as_ptr())).collect();
                steps_and_factors::<SIGNED>(&v, &mut steps, &mut factors);
                round_products::<SIGNED, RUN>(&products, &factors, &mut out);
            }
            let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
            for (r, (&top, &step)) in tops.iter().zip(&steps).enumerate() {
                let usable = top > 0.0 && top.is_finite();
                assert_eq!(step, if usable { top / max } else { 0.0 }, "n {n} run {r}");
                assert_eq!(factors[r], if usable { max / top } else { 0.0 }, "n {n} run {r}");
                for i in r * RUN..n.min(r * RUN + RUN) {
                    let m = if SIGNED { bytes[i] as i8 as f32 } else { bytes[i] as f32 };
                    if usable {
                        let err = (m * step - products[i]).abs();
                        assert!(err <= 0.5 * step * 1.0001, "n {n} product {i}: {m} * {step} vs {}", products[i]);
                    } else {
                        assert_eq!(m, 0.0, "n {n} product {i} of an unusable run");
                    }
                }
            }
        }
        // Keys: runs of 32 channels (head sizes 64, 72, 256); values: a group's 16 rows (1, 3
        // and 12 groups: more than one register of runs).
        for n in [64, 72, 256] {
            check::<true, { STEP_QUADS * 4 }>(n);
        }
        for groups in [1, 3, 12] {
            check::<false, BLOCK_TOKENS>(groups * BLOCK_TOKENS);
        }
    }
}
