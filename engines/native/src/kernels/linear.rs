//! `y = x W^T (+ b)` for a weight stored as on disk (bf16, f16 or f32, `[out, in]` row-major,
//! memory-mapped), computed in f32.
//!
//! Work is split over output rows on the model's thread pool. A task widens a tile of weight rows
//! to f32 in an L1-sized buffer (a shift for bf16, F16C for f16) and takes its dot products with
//! every input row, so decode (one input row per sequence) reads each weight once per step and
//! prefill reuses the widened tile across the chunk. Several projections of the same input
//! (q/k/v, gate/up) run as one parallel call ([`forward_many`]): fewer thread wake-ups per layer.

use crate::checkpoint::{DType, TensorView};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

/// Weight rows widened together (a tile is `TILE x in` f32 values).
const TILE: usize = 4;

pub struct Linear {
    weight: TensorView,
    bias: Option<Vec<f32>>,
    pub rows: usize,
    pub cols: usize,
}

/// A raw output pointer the tasks share: each task writes a disjoint set of columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: tasks write disjoint elements (their own output rows) and the buffer outlives the
// parallel call that uses it.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Linear {
    /// `weight` must be `[rows, cols]`, naturally aligned for its type (safetensors writers
    /// align every tensor); `bias` `[rows]`.
    pub fn new(weight: TensorView, bias: Option<Vec<f32>>) -> Self {
        let (rows, cols) = (weight.shape[0], weight.shape[1]);
        debug_assert!(bias.as_ref().is_none_or(|b| b.len() == rows));
        Linear { weight, bias, rows, cols }
    }

    /// `x`: `n x cols`; returns `y`: `n x rows`.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut Vec<f32>) {
        forward_many(&mut [(self, y)], x, n);
    }

    /// Weight rows `r0..r1` as f32 into `dst`.
    fn widen(&self, r0: usize, r1: usize, dst: &mut [f32]) {
        let cols = self.cols;
        let size = self.weight.dtype.size();
        let bytes = &self.weight.bytes()[r0 * cols * size..r1 * cols * size];
        let dst = &mut dst[..(r1 - r0) * cols];
        match self.weight.dtype {
            DType::BF16 => widen_bf16(bytemuck::cast_slice(bytes), dst),
            DType::F16 => {
                let src: &[f16] = bytemuck::cast_slice(bytes);
                src.convert_to_f32_slice(dst);
            }
            DType::F32 => dst.copy_from_slice(bytemuck::cast_slice(bytes)),
        }
    }

    /// The weight row `r` as f32 (embedding lookups).
    pub fn row(&self, r: usize, dst: &mut [f32]) {
        self.widen(r, r + 1, dst);
    }
}

/// bf16 is the top half of an f32: widening is a shift, which vectorises.
fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits((s as u32) << 16);
    }
}

/// Runs several projections of the same input `x` (`n x cols`, equal `cols`) in one parallel
/// call, each into its own output (`n x rows`).
pub fn forward_many(jobs: &mut [(&Linear, &mut Vec<f32>)], x: &[f32], n: usize) {
    let cols = jobs[0].0.cols;
    debug_assert!(jobs.iter().all(|(l, _)| l.cols == cols) && x.len() == n * cols);
    // Every job's first tile, its weight and its output.
    let (mut starts, mut linears, mut outs) = (Vec::new(), Vec::new(), Vec::new());
    let mut tiles = 0;
    for (l, y) in jobs.iter_mut() {
        y.clear();
        y.resize(n * l.rows, 0.0);
        starts.push(tiles);
        linears.push(*l);
        outs.push(Out(y.as_mut_ptr()));
        tiles += l.rows.div_ceil(TILE);
    }
    // Enough tasks to balance, few enough that each amortises its scheduling.
    let per_task = (tiles / (rayon::current_num_threads() * 4)).max(1);
    (0..tiles).into_par_iter().with_min_len(per_task).for_each_init(
        || vec![0f32; TILE * cols],
        |scratch, tile| {
            let j = starts.partition_point(|&s| s <= tile) - 1;
            let (l, out) = (linears[j], outs[j]);
            let r0 = (tile - starts[j]) * TILE;
            let r1 = (r0 + TILE).min(l.rows);
            l.widen(r0, r1, scratch);
            dispatch(scratch, r1 - r0, cols, x, n, l.rows, r0, out);
            if let Some(b) = &l.bias {
                for t in 0..n {
                    for (r, bias) in b.iter().enumerate().take(r1).skip(r0) {
                        // SAFETY: r is one of this task's rows and t < n: inside the output.
                        unsafe { *out.0.add(t * l.rows + r) += bias };
                    }
                }
            }
        },
    );
}

/// Picks the widest vector code the CPU runs.
#[allow(clippy::too_many_arguments)]
fn dispatch(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, rows: usize, r0: usize, out: Out) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        unsafe { tile_avx2(w, nr, cols, x, n, rows, r0, out) };
        return;
    }
    tile::<false>(w, nr, cols, x, n, rows, r0, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx2(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, rows: usize, r0: usize, out: Out) {
    tile::<true>(w, nr, cols, x, n, rows, r0, out)
}

/// `a * b + c`, fused where the caller was compiled for FMA (a libm call otherwise).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Dot products of `nr` widened weight rows with every input row, written to the output.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<const FMA: bool>(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, rows: usize, r0: usize, out: Out) {
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        if nr == TILE {
            let d = dot4::<FMA>(xt, &w[..cols], &w[cols..2 * cols], &w[2 * cols..3 * cols], &w[3 * cols..4 * cols]);
            for (i, v) in d.into_iter().enumerate() {
                // SAFETY: row r0 + i belongs to this task; t < n.
                unsafe { *out.0.add(t * rows + r0 + i) = v };
            }
        } else {
            for i in 0..nr {
                let v = dot::<FMA>(xt, &w[i * cols..(i + 1) * cols]);
                // SAFETY: as above.
                unsafe { *out.0.add(t * rows + r0 + i) = v };
            }
        }
    }
}

const LANES: usize = 8;

#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let main = a.len() / LANES * LANES;
    for (x, y) in a[..main].chunks_exact(LANES).zip(b[..main].chunks_exact(LANES)) {
        for j in 0..LANES {
            acc[j] = madd::<FMA>(x[j], y[j], acc[j]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in a[main..].iter().zip(&b[main..]) {
        s += x * y;
    }
    s
}

/// Four dot products sharing the loads of `x`.
#[inline(always)]
fn dot4<const FMA: bool>(x: &[f32], w0: &[f32], w1: &[f32], w2: &[f32], w3: &[f32]) -> [f32; 4] {
    let mut acc = [[0f32; LANES]; 4];
    let main = x.len() / LANES * LANES;
    for k in (0..main).step_by(LANES) {
        let xs = &x[k..k + LANES];
        let ws = [&w0[k..k + LANES], &w1[k..k + LANES], &w2[k..k + LANES], &w3[k..k + LANES]];
        for r in 0..4 {
            for j in 0..LANES {
                acc[r][j] = madd::<FMA>(xs[j], ws[r][j], acc[r][j]);
            }
        }
    }
    let mut s = [0f32; 4];
    for r in 0..4 {
        s[r] = acc[r].iter().sum();
    }
    let w = [w0, w1, w2, w3];
    for k in main..x.len() {
        for r in 0..4 {
            s[r] += x[k] * w[r][k];
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_paths_match_a_plain_dot_product() {
        let cols = 37; // not a multiple of the lanes
        let w: Vec<f32> = (0..TILE * cols).map(|i| ((i * 7) as f32 * 0.13).sin()).collect();
        let x: Vec<f32> = (0..2 * cols).map(|i| ((i * 3) as f32 * 0.29).cos()).collect();
        for nr in [TILE, 3] {
            let mut y = vec![0f32; 2 * 8];
            dispatch(&w, nr, cols, &x, 2, 8, 4, Out(y.as_mut_ptr()));
            for t in 0..2 {
                for r in 0..nr {
                    let want: f32 = (0..cols).map(|k| x[t * cols + k] * w[r * cols + k]).sum();
                    let got = y[t * 8 + 4 + r];
                    assert!((got - want).abs() < 1e-4, "nr {nr} t {t} r {r}: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn bf16_widening_is_exact() {
        let values = [1.0f32, -2.5, 3.140625, 0.0, -0.0078125];
        let bits: Vec<u16> = values.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        let mut out = vec![0f32; values.len()];
        widen_bf16(&bits, &mut out);
        assert_eq!(out, values);
    }
}
