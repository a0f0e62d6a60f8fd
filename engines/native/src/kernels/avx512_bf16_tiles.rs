//! [`amx_bf16::products`](super::amx_bf16::products) on AVX-512 BF16 vectors, for CPUs that
//! have `vdpbf16ps` but no AMX (AMD Zen 4 and Zen 5): the same operands (weight tiles, input
//! columns) and the same 16 x 16 sums handed to `put`, so a prompt's attention
//! (`attention_tiles.rs`) runs one code path on both kinds of CPU. A line of an input tile
//! holds one pair of values of 16 inputs, so `vdpbf16ps` of it with a weight row's pair
//! broadcast adds that pair's two products to the row's 16 sums, with no transpose on either
//! side. Each sum is one chain over its row's pairs in order, whatever the rows and groups
//! beside it, so an output does not depend on the inputs computed beside it; the order is not
//! the tiles', so the bits differ from an AMX CPU's.

use super::amx_bf16::{Columns, Line, Sums, Weights, ROWS};
use std::arch::x86_64::*;

/// Weight rows one pass keeps in registers against two input groups: 16 registers of sums,
/// two of inputs and the broadcast pair, of the 32.
const PASS_ROWS: usize = 8;

/// The products of the weight tiles with every input group, handed to `put(group, tile,
/// sums)` as [`super::amx_bf16::products`] hands them.
///
/// # Safety
/// The CPU must pass [`super::avx512_bf16::available`]; `weights` and `inputs` hold rows of
/// the same length.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn products(weights: &Weights, inputs: Columns<'_>, mut put: impl FnMut(usize, usize, &Sums)) {
    let (steps, groups, tiles) = (weights.steps(), inputs.groups(), weights.tiles());
    assert_eq!(steps, inputs.steps());
    let mut sums = [Sums([[0.0; ROWS]; ROWS]), Sums([[0.0; ROWS]; ROWS])];
    let mut g = 0;
    while g < groups {
        let two = g + 1 < groups;
        for t in 0..tiles {
            for rows in (0..ROWS).step_by(PASS_ROWS) {
                // SAFETY: the tiles of step 0 start 16 lines a step apart, `steps` of them,
                // inside both operands; rows..rows + 8 are lines of a weight tile; the sums
                // are 64-byte aligned rows.
                unsafe {
                    let w = weights.tile(t, 0).add(rows);
                    if two {
                        let acc = pass::<2>(w, [inputs.tile(g, 0), inputs.tile(g + 1, 0)], steps);
                        store(&acc, rows, &mut sums);
                    } else {
                        store(&pass::<1>(w, [inputs.tile(g, 0)], steps), rows, &mut sums);
                    }
                }
            }
            put(g, t, &sums[0]);
            if two {
                put(g + 1, t, &sums[1]);
            }
        }
        g += if two { 2 } else { 1 };
    }
}

/// The sums of 8 weight rows (lines `w`, `w + 1`, ... of a tile, its next step 16 lines on)
/// with `G` input groups (tiles at `x`, likewise), over `steps` steps.
///
/// # Safety
/// The CPU must pass [`super::avx512_bf16::available`]; every line read lies in its operand.
#[inline(always)]
unsafe fn pass<const G: usize>(w: *const Line, x: [*const Line; G], steps: usize) -> [[__m512; G]; PASS_ROWS] {
    let mut acc = [[_mm512_setzero_ps(); G]; PASS_ROWS];
    for s in 0..steps {
        // SAFETY: the caller's; lines are 64-byte aligned.
        unsafe {
            let (w, x) = (w.add(s * ROWS), x.map(|x| x.add(s * ROWS)));
            for p in 0..ROWS {
                let inputs = x.map(|x| std::mem::transmute::<__m512i, __m512bh>(_mm512_load_si512(x.add(p).cast())));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let pair = _mm512_set1_epi32((*w.add(i)).0[p] as i32);
                    let pair: __m512bh = std::mem::transmute(pair);
                    for (a, x) in acc.iter_mut().zip(inputs) {
                        *a = _mm512_dpbf16_ps(*a, pair, x);
                    }
                }
            }
        }
    }
    acc
}

/// A pass's sums into rows `rows..rows + 8` of `sums[group]`.
#[inline(always)]
unsafe fn store<const G: usize>(acc: &[[__m512; G]; PASS_ROWS], rows: usize, sums: &mut [Sums; 2]) {
    for (i, acc) in acc.iter().enumerate() {
        for (sums, a) in sums.iter_mut().zip(acc) {
            // SAFETY: a row of Sums is 16 floats, 64-byte aligned; the caller runs with AVX-512F.
            unsafe { _mm512_store_ps(sums.0[rows + i].as_mut_ptr(), *a) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::amx_bf16::{Inputs, STEP};
    use super::super::avx512_bf16::available;
    use super::*;

    fn bf16(v: f32) -> u16 {
        half::bf16::from_f32(v).to_bits()
    }

    /// Every sum against an f64 sum of the same bf16 products, for one and two weight tiles
    /// (the second short) and an odd number of input groups (the last short); each output has
    /// the bits it has when its row is the only row and its group the only group.
    #[test]
    fn vectors_sum_each_rows_products_with_each_input() {
        if !available() {
            eprintln!("no AVX-512 BF16 on this CPU");
            return;
        }
        let (k, n) = (3 * STEP, 40);
        let value = |i: usize, salt: f32| bf16(((i * 7) as f32 * salt).sin() * 3.0);
        let x: Vec<u16> = (0..n * k).map(|i| value(i, 0.013)).collect();
        let mut inputs = Inputs::default();
        // SAFETY: available() checked the CPU; x holds n rows of k values.
        unsafe { inputs.pack(&x, n, k) };
        let wide = |v: u16| half::bf16::from_bits(v).to_f64();
        for rows in [16, 27] {
            let w: Vec<u16> = (0..rows * k).map(|i| value(i, 0.029)).collect();
            let mut weights = Weights::default();
            // SAFETY: as above; w holds `rows` rows of k values.
            unsafe { weights.copy(&w, k) };
            let mut got = vec![f32::NAN; rows * n];
            // SAFETY: as above; both hold rows of k values.
            unsafe {
                products(&weights, inputs.columns(), |g, t, sums| {
                    for (i, row) in sums.0.iter().enumerate().filter(|(i, _)| t * ROWS + i < rows) {
                        for (j, &v) in row.iter().enumerate().filter(|(j, _)| g * ROWS + j < n) {
                            got[(t * ROWS + i) * n + g * ROWS + j] = v;
                        }
                    }
                })
            };
            for r in 0..rows {
                for j in 0..n {
                    let want: f64 = (0..k).map(|c| wide(w[r * k + c]) * wide(x[j * k + c])).sum();
                    let v = got[r * n + j] as f64;
                    assert!((v - want).abs() < 1e-4, "row {r}, input {j}: {v} vs {want}");
                }
            }
            // Row 20 of the second call alone (as the first row of a tile), against group 2
            // alone: the same bits.
            let r = rows - 7;
            let mut one = Weights::default();
            // SAFETY: as above.
            unsafe { one.copy(&w[r * k..(r + 1) * k], k) };
            let mut alone = [f32::NAN; ROWS];
            // SAFETY: as above.
            unsafe { products(&one, inputs.groups(2..3), |_, _, sums| alone.copy_from_slice(&sums.0[0])) };
            assert_eq!(alone[..n - 2 * ROWS], got[r * n + 2 * ROWS..(r + 1) * n]);
        }
    }
}
