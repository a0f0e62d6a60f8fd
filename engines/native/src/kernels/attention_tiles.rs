//! A prompt tile's attention in bf16 tile products (`amx_bf16.rs`), on AMX tiles or, where the
//! CPU has none, on AVX-512 BF16 vectors (`avx512_bf16_tiles.rs`; [`Bf16Unit`]): the scores
//! of the tile's query rows (its queries times the query heads of one KV head) against every
//! key they see, and the weighted sums of the values, each as one product with f32 sums. The
//! softmax between stays f32, on 16 lanes ([`softmax`]).
//!
//! The keys are exact and the queries kept to 16 bits, each as two bf16 halves ([`scores`]);
//! the values and the softmax weights are rounded to bf16, as torch's bf16 attention rounds
//! them. Blocks stored at int8 or int4 come here widened from their codes (keys to 16 bits,
//! values to bf16), where decoding tokens read them with the integer kernels. Only steps
//! whose projections take bf16 products at prompt size come here (64 rows and more, see
//! `linear.rs`), so decoding tokens and drafts keep the f32 kernels' bits. Each sum runs over
//! its row in 32-value steps in the same order whatever the tile, so a query's output does not
//! depend on the queries beside it.
//!
//! The second operand is always the cache's side: keys with their channel pairs turned into
//! columns ([`pack_keys`], once a layer for every tile of a sequence), values (bf16 rows, also
//! made once a layer by the caller) with position pairs interleaved (`Inputs::interleave`, per
//! tile).
//! Both come out as `[query row][key or channel]`, the layout the softmax and the output
//! want, with no transpose of the sums.

use super::amx_bf16::{pack_rows_on_pool, products_on, Columns, Inputs, Weights, ROWS, STEP};
use super::avx512_bf16::{narrow, split, Widen16};
use super::Bf16Unit;
use half::f16;

/// Query or weight rows one product takes: the two tiles of the first operand.
const LHS_ROWS: usize = 2 * ROWS;

/// A task's buffers, reused from tile to tile: the two products' first operands apart, so
/// that no buffer changes size between the two (growing one writes zeros).
#[derive(Default)]
pub struct Scratch {
    queries: Lhs,
    weights: Lhs,
    rhs: Inputs,
}

/// Up to 32 query or weight rows, as bf16 rows and as tiles.
#[derive(Default)]
struct Lhs {
    rows: Vec<u16>,
    tiles: Weights,
}

/// One key as [`pack_keys`] reads it.
pub enum Key<'k> {
    /// A row of f16 values, packed exact.
    F16(&'k [f16]),
    /// Written as f32 into the row the callback was given (a quantized block's key, widened
    /// from its codes), packed to 16 bits.
    Widened,
    /// Zeros: a position no product reads (an evicted block's).
    Absent,
}

/// Packs keys as the second operand of [`scores`]: into each of `keys`, `(buffer, n)`, `n`
/// keys, `key(i, j, row)` key `j` of the `i`-th, `row` `hd` values it may write the key into
/// ([`Key`]); in one parallel call, a group of 16 keys a task. A prompt chunk's query tiles
/// all read their sequence's keys: packed once a layer for all of them, where each tile
/// packed every key it saw, 16-query tiles over a 512-token prompt repacking a key up to 32
/// times.
///
/// # Safety
/// The CPU must pass [`super::avx512_bf16::available`]; `hd` is a multiple of [`STEP`].
pub unsafe fn pack_keys<'a, 'k>(
    keys: impl IntoIterator<Item = (&'a mut Inputs, usize)>,
    hd: usize,
    key: impl Fn(usize, usize, &mut [f32]) -> Key<'k> + Sync,
) {
    assert!(hd.is_multiple_of(STEP));
    // Each thread's row for widened keys.
    thread_local!(static WIDENED: std::cell::RefCell<Vec<f32>> = std::cell::RefCell::default());
    // Each key as [hi | hi | lo], the two bf16 halves of its values (`split`): see `scores`.
    let row = |i: usize, j: usize, row: &mut [u16]| {
        WIDENED.with_borrow_mut(|wide| {
            wide.resize(hd, 0.0);
            // SAFETY (both): the caller checked the CPU.
            match key(i, j, &mut wide[..hd]) {
                Key::F16(key) => unsafe { halves(&key[..hd], row, Lo::Last) },
                Key::Widened => unsafe { halves(&wide[..hd], row, Lo::Last) },
                Key::Absent => return false,
            }
            true
        })
    };
    // SAFETY: as above; the rows are 3 * hd values, whole steps.
    unsafe { pack_rows_on_pool(keys, 3 * hd, row) };
}

/// `scores[r * len + j] = scale * query(r) . key j` for `rows` query rows of `hd` values and
/// the first `len` keys of `keys`, packed by [`pack_keys`], the products on `unit`.
///
/// # Safety
/// The CPU must have `unit` ([`Bf16Unit::available`]); `hd` is a multiple of [`STEP`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn scores<'q>(
    unit: Bf16Unit,
    s: &mut Scratch,
    rows: usize,
    query: impl Fn(usize) -> &'q [f32],
    keys: Columns<'_>,
    len: usize,
    hd: usize,
    scale: f32,
    scores: &mut [f32],
) {
    assert!(hd.is_multiple_of(STEP) && keys.groups() == len.div_ceil(ROWS));
    assert!(scores.len() >= rows * len);
    // Each query as [hi | lo | hi] against each key's [hi | hi | lo]: one product over three
    // times the channels sums q_hi k_hi + q_lo k_hi + q_hi k_lo, the keys exact (an f16 value
    // is the sum of its halves) and the queries to 16 bits. Keys rounded to bf16 alone moved
    // Qwen2.5's perplexity by 0.2% and tripled its KL divergence from the f32 kernels: its
    // keys carry large biases, and one rounding step of such a key outweighs the score
    // differences that matter.
    let (k, lhs) = (3 * hd, &mut s.queries);
    for r0 in (0..rows).step_by(LHS_ROWS) {
        let nr = (rows - r0).min(LHS_ROWS);
        lhs.rows.resize(nr * k, 0);
        for (r, row) in lhs.rows.chunks_exact_mut(k).take(nr).enumerate() {
            // SAFETY (and below): the caller checked the CPU.
            unsafe { halves(&query(r0 + r)[..hd], row, Lo::Middle) };
        }
        unsafe { lhs.tiles.copy(&lhs.rows[..nr * k], k) };
        // Tile `tile` of this chunk's rows against keys g * 16..
        let put = |g: usize, tile: usize, sums: &super::amx_bf16::Sums| {
            let keys = (len - g * ROWS).min(ROWS);
            for (i, sums) in sums.0.iter().enumerate().take(nr.saturating_sub(tile * ROWS)) {
                let r = r0 + tile * ROWS + i;
                for (o, v) in scores[r * len + g * ROWS..][..keys].iter_mut().zip(sums) {
                    *o = v * scale;
                }
            }
        };
        unsafe { products_on(unit, &lhs.tiles, keys, &[], put) };
    }
}

/// Where [`halves`] puts the low half.
#[derive(Clone, Copy)]
enum Lo {
    Middle,
    Last,
}

/// `x` as three runs of bf16 in `row`: its high halves, then its low and high halves in the
/// order `lo` says.
///
/// # Safety
/// The CPU must pass [`super::avx512_bf16::available`].
unsafe fn halves<T: Widen16>(x: &[T], row: &mut [u16], lo: Lo) {
    let (hi, rest) = row.split_at_mut(x.len());
    let (a, b) = rest.split_at_mut(x.len());
    let (low, again) = match lo {
        Lo::Middle => (a, b),
        Lo::Last => (b, a),
    };
    // SAFETY: the caller checked the CPU.
    unsafe { split(x, hi, low) };
    again.copy_from_slice(hi);
}

/// `out(r)[c] = sum over j of weights[r * len + j] * value j [c]` for `rows` weight rows of
/// `len` and the `len` values of `values`, bf16 rows of `hd` in position order. Values and
/// weights are rounded to bf16: each output is a mean of values, and rounding them moved
/// neither model's perplexity (splitting them as the keys are did not help). The products on
/// `unit`.
///
/// # Safety
/// The CPU must have `unit` ([`Bf16Unit::available`]); `hd` is a multiple of [`STEP`];
/// `out(r)` for `r < rows` points to `hd` writable floats.
pub unsafe fn weighted_sums(
    unit: Bf16Unit,
    s: &mut Scratch,
    rows: usize,
    weights: &[f32],
    values: &[u16],
    hd: usize,
    out: impl Fn(usize) -> *mut f32,
) {
    assert!(hd.is_multiple_of(STEP) && values.len().is_multiple_of(hd));
    let len = values.len() / hd;
    assert!(weights.len() >= rows * len);
    let (k, lhs) = (len.next_multiple_of(STEP), &mut s.weights);
    // SAFETY (each call below): the caller checked the CPU; the weight rows are padded with
    // zeros to whole steps, as `interleave` pads the values.
    unsafe { s.rhs.interleave(values, len, hd) };
    for r0 in (0..rows).step_by(LHS_ROWS) {
        let nr = (rows - r0).min(LHS_ROWS);
        lhs.rows.resize(nr * k, 0);
        for (r, row) in lhs.rows.chunks_exact_mut(k).take(nr).enumerate() {
            unsafe { narrow(&weights[(r0 + r) * len..][..len], &mut row[..len]) };
            row[len..].fill(0); // to the step's end, as the values
        }
        unsafe { lhs.tiles.copy(&lhs.rows[..nr * k], k) };
        // Tile `tile` of this chunk's rows: channels g * 16.. of their sums.
        let put = |g: usize, tile: usize, sums: &super::amx_bf16::Sums| {
            for (i, sums) in sums.0.iter().enumerate().take(nr.saturating_sub(tile * ROWS)) {
                // SAFETY: row r0 + tile * 16 + i < rows; channels g * 16..+16 lie within hd.
                unsafe { std::ptr::copy_nonoverlapping(sums.as_ptr(), out(r0 + tile * ROWS + i).add(g * ROWS), ROWS) };
            }
        };
        unsafe { products_on(unit, &lhs.tiles, s.rhs.columns(), &[], put) };
    }
}

/// Softmax of `x` in place, a `sink` logit counting in the denominator only: the tile rows'
/// softmax on 16 lanes (the 8-lane one of `attention_avx2.rs`, which decode keeps for its
/// bits, took 6% of a prompt). `-inf` scores (positions a query does not see) weigh exactly 0.
///
/// # Safety
/// The CPU must have AVX-512F (both units' CPUs do).
#[target_feature(enable = "avx512f")]
pub unsafe fn softmax(x: &mut [f32], sink: Option<f32>) {
    use std::arch::x86_64::*;
    let (n, p) = (x.len(), x.as_mut_ptr());
    let lanes = |i: usize| if n - i >= 16 { u16::MAX } else { (1u16 << (n - i)) - 1 };
    let none = _mm512_set1_ps(f32::NEG_INFINITY);
    // SAFETY (every access): the masks keep to the n values of x.
    unsafe {
        let mut m = none;
        for i in (0..n).step_by(16) {
            m = _mm512_max_ps(m, _mm512_mask_loadu_ps(none, lanes(i), p.add(i)));
        }
        let max = _mm512_reduce_max_ps(m).max(sink.unwrap_or(f32::NEG_INFINITY));
        let mv = _mm512_set1_ps(max);
        let mut sum = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            let e = exp16(_mm512_sub_ps(_mm512_mask_loadu_ps(none, lanes(i), p.add(i)), mv));
            _mm512_mask_storeu_ps(p.add(i), lanes(i), e);
            sum = _mm512_add_ps(sum, e);
        }
        let sink = sink.map_or(0.0, |s| _mm512_cvtss_f32(exp16(_mm512_set1_ps(s - max))));
        let inv = _mm512_set1_ps(1.0 / (_mm512_reduce_add_ps(sum) + sink));
        for i in (0..n).step_by(16) {
            let w = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(i), p.add(i)), inv);
            _mm512_mask_storeu_ps(p.add(i), lanes(i), w);
        }
    }
}

/// `e^x` for each lane where `x <= 0`, as `attention_avx2::exp8` computes it (its constants,
/// the same steps) on 16 lanes; 0 below the smallest normal result and for `-inf`.
#[inline(always)]
unsafe fn exp16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use super::attention_avx2::{EXP_LN2, EXP_LOWEST, EXP_POLY};
    use std::arch::x86_64::*;
    // SAFETY: register-only operations; the caller runs with AVX-512F.
    unsafe {
        let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(EXP_LOWEST));
        let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LOWEST));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            x,
            _mm512_set1_ps(std::f32::consts::LOG2_E),
        ));
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2[0]), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2[1]), r);
        let mut y = _mm512_set1_ps(EXP_POLY[0]);
        for c in EXP_POLY[1..].iter().copied() {
            y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
        }
        // e^r = 1 + r + r^2 * y
        let y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0));
        let pow2n = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        )));
        _mm512_maskz_mul_ps(keep, y, pow2n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::avx512_bf16::available;

    /// The units this CPU has.
    fn units() -> Vec<Bf16Unit> {
        let units: Vec<_> = [Bf16Unit::Tiles, Bf16Unit::Vectors].into_iter().filter(|u| u.available()).collect();
        if units.is_empty() {
            eprintln!("no AVX-512 BF16 on this CPU");
        }
        units
    }

    fn rounded(v: f32) -> f64 {
        half::bf16::from_f32(v).to_f64()
    }

    /// The 16-lane softmax is the 8-lane one up to the sum's order: lengths around whole
    /// vectors, a sink, positions at -inf that weigh exactly 0, scores below e^-87.
    #[test]
    fn the_tile_softmax_matches_decodes_softmax() {
        if !available() {
            eprintln!("no AVX-512 BF16 on this CPU");
            return;
        }
        for n in [1, 7, 15, 16, 17, 33, 100] {
            for sink in [None, Some(0.5f32)] {
                let x: Vec<f32> = (0..n)
                    .map(|i| match i % 11 {
                        3 => f32::NEG_INFINITY,
                        5 => -120.0,
                        _ => ((i * 7) as f32 * 0.37).sin() * 9.0,
                    })
                    .collect();
                let (mut got, mut want) = (x.clone(), x.clone());
                // SAFETY: available() checked the CPU (AVX-512F, AVX2 and FMA with it).
                unsafe {
                    softmax(&mut got, sink);
                    crate::kernels::attention_avx2::softmax(&mut want, sink);
                }
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() <= 1e-6 * w.abs(), "n {n} sink {sink:?} [{i}]: {g} vs {w}");
                    if x[i] == f32::NEG_INFINITY || x[i] == -120.0 {
                        assert_eq!(g.to_bits(), 0, "n {n} [{i}]");
                    }
                }
                let total: f32 = got.iter().sum();
                // The sink takes its share of the denominator.
                assert!(if sink.is_some() { total < 1.0 - 1e-6 } else { (total - 1.0).abs() < 1e-5 }, "n {n}: {total}");
            }
        }
    }

    /// The scores against exact f64 sums, the weighted sums against f64 sums of the operands
    /// rounded to bf16, a length that is not a whole step and a row count that is not a whole
    /// tile; a row computed alone, or against the keys from the second group on, has the bits
    /// it has among others; keys packed as absent (a key alone, a whole group) score 0, and
    /// keys given widened to f32 pack as their f16 rows do. On each unit the CPU has.
    #[test]
    fn scores_are_exact_to_16_bits_and_weighted_sums_the_products_of_the_rounded_operands() {
        for unit in units() {
            products_of_the_rounded_operands(unit);
        }
    }

    fn products_of_the_rounded_operands(unit: Bf16Unit) {
        let (hd, len, rows) = (64, 45, 37);
        let cache = |salt: f32| -> Vec<f16> {
            (0..len * hd).map(|i| f16::from_f32(((i * 7) as f32 * salt).sin() * 2.0)).collect()
        };
        let (keys, values) = (cache(0.013), cache(0.029));
        let mut rounded_values = vec![0u16; len * hd];
        // SAFETY: units() checked the CPU.
        unsafe { narrow(&values, &mut rounded_values) };
        let key = |j: usize| &keys[j * hd..][..hd];
        let (mut packed, mut holed, mut widened) = (Inputs::default(), Inputs::default(), Inputs::default());
        // The second buffer without key 7 and keys 16..32; the third's keys given as f32.
        let absent = |j: usize| j == 7 || (ROWS..2 * ROWS).contains(&j);
        let pack = |i: usize, j: usize, row: &mut [f32]| match i {
            1 if absent(j) => Key::Absent,
            2 => {
                row.iter_mut().zip(key(j)).for_each(|(r, k)| *r = k.to_f32());
                Key::Widened
            }
            _ => Key::F16(key(j)),
        };
        // SAFETY: units() checked the CPU; hd is two steps.
        unsafe { pack_keys([(&mut packed, len), (&mut holed, len), (&mut widened, len)], hd, pack) };
        let q: Vec<f32> = (0..rows * hd).map(|i| ((i * 3) as f32 * 0.031).cos()).collect();
        let query = |r: usize| &q[r * hd..][..hd];
        let mut s = Scratch::default();
        let mut got = vec![f32::NAN; rows * len];
        // SAFETY: units() checked the CPU; hd is two steps.
        unsafe { scores(unit, &mut s, rows, query, packed.columns(), len, hd, 0.5, &mut got) };
        for r in 0..rows {
            for j in 0..len {
                // The exact product, within the queries' 16 bits: far inside one bf16 step.
                let terms = (0..hd).map(|c| q[r * hd + c] as f64 * keys[j * hd + c].to_f64());
                let (want, size) = terms.fold((0.0, 0.0), |(sum, size), t| (sum + t * 0.5, size + t.abs() * 0.5));
                let v = got[r * len + j] as f64;
                assert!(
                    (v - want).abs() <= size * 2f64.powi(-15),
                    "{unit:?}: score of row {r}, key {j}: {v} vs {want}"
                );
            }
        }
        let w: Vec<f32> = (0..rows * len).map(|i| ((i * 5) as f32 * 0.07).sin().abs() / len as f32).collect();
        let mut out = vec![f32::NAN; rows * hd];
        let base = out.as_mut_ptr();
        let at = move |r: usize| base.wrapping_add(r * hd);
        // SAFETY: as above; out holds rows x hd.
        unsafe { weighted_sums(unit, &mut s, rows, &w, &rounded_values, hd, at) };
        for r in 0..rows {
            for c in 0..hd {
                let want: f64 = (0..len).map(|j| rounded(w[r * len + j]) * rounded(values[j * hd + c].to_f32())).sum();
                let v = out[r * hd + c] as f64;
                assert!((v - want).abs() < 1e-5, "{unit:?}: output of row {r}, channel {c}: {v} vs {want}");
            }
        }
        // Row 33 alone, against every key and against keys 16.. alone: the same bits.
        let (mut alone, mut later) = (vec![f32::NAN; len], vec![f32::NAN; len - ROWS]);
        // SAFETY: as above.
        unsafe {
            scores(unit, &mut s, 1, |_| query(33), packed.columns(), len, hd, 0.5, &mut alone);
            scores(unit, &mut s, 1, |_| query(33), packed.groups(1..3), len - ROWS, hd, 0.5, &mut later);
        }
        assert_eq!(alone, got[33 * len..34 * len]);
        assert_eq!(later, got[33 * len + ROWS..34 * len]);
        // SAFETY: as above.
        unsafe { scores(unit, &mut s, 1, |_| query(33), holed.columns(), len, hd, 0.5, &mut alone) };
        for (j, (&v, &want)) in alone.iter().zip(&got[33 * len..34 * len]).enumerate() {
            assert_eq!(v, if absent(j) { 0.0 } else { want }, "key {j}");
        }
        // SAFETY: as above.
        unsafe { scores(unit, &mut s, 1, |_| query(33), widened.columns(), len, hd, 0.5, &mut alone) };
        assert_eq!(alone, got[33 * len..34 * len], "keys widened to f32 pack as their f16 rows");
        let mut one = vec![f32::NAN; hd];
        let base = one.as_mut_ptr();
        // SAFETY: as above.
        unsafe { weighted_sums(unit, &mut s, 1, &w[33 * len..34 * len], &rounded_values, hd, move |_| base) };
        assert_eq!(one, out[33 * hd..34 * hd]);
    }
}
